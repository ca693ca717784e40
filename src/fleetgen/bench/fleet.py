"""`fleetgen bench` over a fleet: the servers' ready endpoints (`BenchServers`), and `--compare-spec`.

`--compare-spec` is two deploys: the fleet file with every `speculative*` engine arg removed (written beside
it as `<name>.spec-off.toml`, so relative paths and the shared `.fleetgen/state.json` stay the same),
restarted and benched; then the user's own fleet file restarted and benched. The fleet is left running as
the user's file says (spec on). The speedup pairs the levels by target and concurrency.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import tomli_w

from fleetgen.bench.stats import BenchLoad, BenchTarget, LevelResult, SpeedupRow, speedups
from fleetgen.bench.sweep import sweep
from fleetgen.deploy.death import Death
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import up
from fleetgen.errors import ConfigError, EndpointError, EngineDied, FleetgenError
from fleetgen.fleet.pool import Link

SPEC_ARG_PREFIX = "speculative"  # SGLang's speculative-*, vLLM's speculative-config


# what `bench` sweeps: each instance alone, the whole fleet as one target, or both
Scope = Literal["instances", "fleet", "both"]
SCOPES: tuple[Scope, ...] = ("instances", "fleet", "both")


def targets_of(names_urls: Sequence[tuple[str, str]], scope: Scope) -> list[BenchTarget]:
    """One target per instance and/or one for the whole fleet (only when there are several instances)."""
    targets = (
        [BenchTarget(name, (url,)) for name, url in names_urls] if scope in ("both", "instances") else []
    )
    if scope in ("both", "fleet") and (len(names_urls) > 1 or not targets):
        targets.append(BenchTarget("fleet", tuple(url for _, url in names_urls)))
    return targets


def running_caps(endpoints: Sequence[Link]) -> list[int | None]:
    """What caps a sweep's concurrency on each endpoint: its engine's max running requests, unless that is a
    floor it runs past (vLLM without max-num-seqs: 105 said on the H200, 298 ran), which caps nothing."""
    return [None if e.running_is_floor else e.max_running_requests for e in endpoints]


@dataclass(frozen=True)
class BenchServers:
    """What a sweep runs on, as plain values from the command's servers (`cli.servers.ServerSource`): the
    ready endpoints (their key, their engines' running caps: none known for a bare URL) and `deaths`, why the
    named engines died in their own words (none known for a bare URL)."""

    endpoints: Sequence[Link]
    deaths: Callable[[Sequence[str]], Awaitable[Mapping[str, Death]]]


async def bench_fleet(
    servers: BenchServers,
    load: BenchLoad,
    *,
    scope: Scope = "both",
    cap: int | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> list[LevelResult]:
    """Sweep the servers' ready endpoints (capped by what their engines admit, with their API key); a sweep
    that failed is said as the engines that died say it."""
    endpoints = servers.endpoints
    pairs = [(e.name, e.url) for e in endpoints]
    key = next((e.api_key for e in endpoints if e.api_key), None)
    if key and not load.api_key:
        load = dataclasses.replace(load, api_key=key)
    try:
        return await sweep(
            targets_of(pairs, scope), load, caps=[cap, *running_caps(endpoints)], on_level=on_level
        )
    except EndpointError as exc:
        said = _in_engines_words(await servers.deaths([name for name, _ in pairs]), exc)
        if said is exc:
            raise
        raise said from exc


def _in_engines_words(deaths: Mapping[str, Death], exc: EndpointError) -> FleetgenError:
    """A sweep that failed, as the engines that died say it (`deaths`: each one's last error, where it was
    raised, the fix); `exc` itself where none did."""
    if not deaths:
        return exc
    said = "; ".join(f"{name}: {died.text()}" for name, died in deaths.items())
    fixes = "; ".join(dict.fromkeys(died.fix for died in deaths.values()))
    return EngineDied(f"the engine died during the sweep: {said}", fix=fixes, context=exc.context)


async def compare_spec(
    fleet: Fleet, bench: Callable[[Fleet], Awaitable[list[LevelResult]]]
) -> tuple[list[LevelResult], list[LevelResult], list[SpeedupRow]]:
    """Deploy spec off, `bench` it (`bench_fleet` with the load and its options); deploy the fleet file as
    written (spec on), `bench` it; pair the results."""
    spec_off = write_spec_off(fleet)
    try:
        await _restart(spec_off)
        off = await bench(spec_off)
    except FleetgenError as exc:
        # Not silent: the fleet now runs (some of) the spec-off deploy, unlike what the fleet file says.
        exc.context["fleet left"] = "deployed WITHOUT speculative decoding (the --compare-spec off phase)"
        exc.fix = f"{exc.fix}; then `fleetgen up -f {fleet.path}` restores the fleet file's deploy".lstrip(
            "; "
        )
        raise
    finally:
        spec_off.path.unlink(missing_ok=True)
    await _restart(fleet)
    on = await bench(fleet)
    return off, on, speedups(off, on)


async def _restart(fleet: Fleet) -> None:
    for outcome in await up(fleet, force=True):
        if outcome.error is not None:
            raise outcome.error


def write_spec_off(fleet: Fleet) -> Fleet:
    """Write the (loaded) fleet file without its speculative engine args beside it, and load that; refuse
    when it has none."""
    data = tomllib.loads(fleet.path.read_text(encoding="utf-8"))
    args = data.get("engine", {}).get("args", {})
    spec_keys = [k for k in args if k.startswith(SPEC_ARG_PREFIX)]
    if not spec_keys:
        raise ConfigError(
            f"{fleet.path}: engine.args has no speculative decoding flags to turn off",
            fix='add them (e.g. speculative-algorithm = "EAGLE" for SGLang, speculative-config '
            "for vLLM), or run without --compare-spec",
        )
    data["engine"]["args"] = {k: v for k, v in args.items() if k not in spec_keys}
    off_path = fleet.path.with_name(fleet.path.stem + ".spec-off.toml")
    off_path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return Fleet.load(off_path)  # what we wrote must read back as a valid fleet file
