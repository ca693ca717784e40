"""Verify a running instance: process, the engine's own view, a real request, speculative decoding, capacity.

Nothing is taken on trust: argv and environ come from /proc and must equal what was rendered ("drift"
otherwise); the engine's /server_info must show the intended speculative settings, Mamba strategy, memory
fraction and concurrency; one chat completion must succeed; with speculative decoding configured, an accept
length must be readable afterwards (no speculative step = not ready). Capacity is reported planned vs actual.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgen.deploy.probe import EngineClient, accept_length, parse_metrics
from fleetgen.deploy.script import LaunchSpec, redact_argv, redact_environ
from fleetgen.engines.base import Engine
from fleetgen.errors import VerifyError
from fleetgen.remote.base import ProcInfo

# Flags whose effect the engine reports back in /server_info (SGLang's ServerArgs field = flag with `_`).
# Each entry: the flag names (old, new), the /server_info keys to read.
VIEW_CHECKS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("speculative-algorithm",), ("speculative_algorithm",)),
    (("speculative-num-steps",), ("speculative_num_steps",)),
    (("speculative-eagle-topk",), ("speculative_eagle_topk",)),
    (("speculative-num-draft-tokens",), ("speculative_num_draft_tokens",)),
    (
        ("mamba-radix-cache-strategy", "mamba-scheduler-strategy"),
        ("mamba_radix_cache_strategy", "mamba_scheduler_strategy"),
    ),
    (("mem-fraction-static",), ("mem_fraction_static",)),
    (("max-running-requests",), ("max_running_requests",)),
)
# SGLang rewrites NEXTN to EAGLE before it reports the algorithm.
ALIASES = {"NEXTN": "EAGLE"}
SPEC_FLAGS = ("speculative-algorithm", "speculative-config")

# Capacity as the engines log it at start (SGLang scheduler / memory pool, vLLM KV cache manager).
CAPACITY_LINES: tuple[tuple[str, str], ...] = (
    ("kv_tokens", r"max_total_num_tokens=(\d+)"),
    ("kv_tokens", r"KV Cache is allocated\..*#tokens: (\d+)"),
    ("kv_tokens", r"KV cache size: ([\d,]+) tokens"),
    ("max_running_requests", r"max_running_requests=(\d+)"),
    ("mamba_slots", r"Mamba Cache is allocated\..*?(?:max_mamba_cache_size|#slots|size)[:=] ?(\d+)"),
)


@dataclass(frozen=True)
class CapacityRow:
    """One capacity figure, planned next to what the engine reports."""

    what: str
    planned: float | None
    actual: float | None


@dataclass
class Verified:
    """Everything verification established about one instance."""

    model: str = ""
    accept_length: float | None = None
    capacity: list[CapacityRow] = field(default_factory=list)
    info: Any = None
    max_running_requests: int | None = None


def process_drift(spec: LaunchSpec, proc: ProcInfo, secret_value: str | None) -> list[str]:
    """Differences between the rendered argv/env and the running process's; empty when none."""
    drift: list[str] = []
    running_argv = redact_argv(proc.argv, spec, secret_value)
    if tuple(running_argv) != spec.argv:
        diff = difflib.ndiff(list(spec.argv), list(running_argv))
        changed = [d for d in diff if d[:1] in "+-"]
        drift.append("argv differs (- rendered, + running): " + " ".join(changed))
    running_env = redact_environ(proc.environ, spec, secret_value)
    for name, want in sorted(spec.environ.items()):
        got = running_env.get(name)
        if got is None:
            drift.append(f"env {name}: rendered {want!r}, missing in the running process")
        elif got != want:
            drift.append(f"env {name}: rendered {want!r}, running {got!r}")
    return drift


def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value after the last `--name` in args (or `--name=value`)."""
    value: str | None = None
    for i, part in enumerate(args):
        for name in names:
            if part == f"--{name}" and i + 1 < len(args):
                value = args[i + 1]
            elif part.startswith(f"--{name}="):
                value = part.split("=", 1)[1]
    return value


def is_spec_configured(args: Sequence[str]) -> bool:
    return flag_value(args, SPEC_FLAGS) is not None


def view_mismatches(args: Sequence[str], info: Mapping[str, Any]) -> list[str]:
    """Flags set in `args` whose effect /server_info does not show (SGLang); empty when all match."""
    problems: list[str] = []
    for flags, keys in VIEW_CHECKS:
        want = flag_value(args, flags)
        if want is None:
            continue
        key = next((k for k in keys if k in info), None)
        got = info.get(key) if key else None
        if not _same(want, got):
            problems.append(f"--{flags[0]} {want}: the server reports {keys[0]} = {got!r}")
    return problems


def _same(want: str, got: Any) -> bool:
    if got is None:
        return False
    want = ALIASES.get(want.upper(), want) if isinstance(got, str) else want
    if isinstance(got, bool | str):
        return str(got).lower() == want.lower()
    try:
        return abs(float(got) - float(want)) < 1e-9
    except (TypeError, ValueError):
        return False


def capacity_from_log(lines: Sequence[str]) -> dict[str, float]:
    """Capacity figures the engine logged at start (the last occurrence wins)."""
    found: dict[str, float] = {}
    for line in lines:
        for what, pattern in CAPACITY_LINES:
            match = re.search(pattern, line)
            if match:
                found[what] = float(match.group(1).replace(",", ""))
    return found


def capacity_from_info(info: Any) -> dict[str, float]:
    """Capacity figures in SGLang's /server_info (top level, scheduler_info, internal_states)."""
    found: dict[str, float] = {}
    if not isinstance(info, dict):
        return found
    places = [info, info.get("scheduler_info") or {}, *(info.get("internal_states") or [])]
    for place in places:
        if not isinstance(place, dict):
            continue
        for key, what in (
            ("max_total_num_tokens", "kv_tokens"),
            ("max_mamba_cache_size", "mamba_slots"),
            ("effective_max_running_requests_per_dp", "max_running_requests"),
        ):
            if isinstance(place.get(key), int | float) and place[key]:
                found[what] = float(place[key])
    return found


def capacity_rows(planned: Mapping[str, float], actual: Mapping[str, float]) -> list[CapacityRow]:
    return [CapacityRow(what, planned.get(what), actual.get(what)) for what in sorted({*planned, *actual})]


async def verify_engine(
    spec: LaunchSpec,
    engine: Engine,
    client: EngineClient,
    *,
    log_lines: Sequence[str],
    planned: Mapping[str, float],
) -> Verified:
    """The engine's own view, one real chat request, the accept length (when speculative), capacity."""
    out = Verified(model=await _served_model(spec, client))
    _, out.info = await client.first_json(engine.info_paths)
    _check_view(spec, client, out.info)
    await client.chat(out.model)
    if is_spec_configured(spec.args):
        out.accept_length = await _spec_accept_length(spec, engine, client)
    actual = {**capacity_from_log(log_lines), **capacity_from_info(out.info)}
    out.capacity = capacity_rows(planned, actual)
    mrr = actual.get("max_running_requests")
    out.max_running_requests = int(mrr) if mrr else None
    return out


async def _served_model(spec: LaunchSpec, client: EngineClient) -> str:
    models = await client.get_json("/v1/models")
    data = models.get("data", []) if isinstance(models, dict) else []
    ids = [m.get("id") for m in data if isinstance(m, dict) and m.get("id")]
    if not ids:
        raise VerifyError(f"{spec.instance}: /v1/models lists no model", context={"url": client.base_url})
    return str(ids[0])


def _check_view(spec: LaunchSpec, client: EngineClient, info: Any) -> None:
    """Refuse when the engine's own view (SGLang's /server_info) contradicts the flags it was given."""
    if not (_looks_like_server_args(info) or (isinstance(info, dict) and "internal_states" in info)):
        return
    problems = view_mismatches(spec.args, info)
    if problems:
        raise VerifyError(
            f"{spec.instance}: the engine does not run what was asked",
            fix="the engine overrode or ignored these flags; read its log for the reason "
            f"(`fleetgen logs {spec.instance}`) and adjust engine.args",
            context={"mismatches": "\n".join(problems), "url": client.base_url},
        )


async def _spec_accept_length(spec: LaunchSpec, engine: Engine, client: EngineClient) -> float:
    """Accept length after the test request; no speculative step at all means not ready."""
    samples = parse_metrics(await client.get_text(engine.metrics_path))
    _, info = await client.first_json(engine.info_paths)
    value = accept_length(engine.metrics, samples, info)
    if value is None:
        raise VerifyError(
            f"{spec.instance}: speculative decoding is configured but no speculative step happened during "
            "the test request",
            fix="check the speculative flags and the draft model in the log; the server runs without it "
            "(slower than planned)",
            context={"url": client.base_url},
        )
    return value


def _looks_like_server_args(info: Any) -> bool:
    return isinstance(info, dict) and ("model_path" in info or "mem_fraction_static" in info)
