"""Where a command's servers come from (`ServerSource`): a fleet file (`FleetFileServers`: its instances
from the deploy state and their placement, its model folder, its engine) or bare `--endpoint` URLs
(`URLServers`: the URLs as given, no model folder, each engine probed). `read_servers` chooses once, where the
command line is read; `run`, `dashboard` and `bench` then ask the source, never which one it is.

Why here, at the CLI's level: what each command asks for is of its own layer — `run` a `generate.JobServers`,
the dashboard its rows' source, `bench` its endpoints — and no layer below the CLI may import all three.
`bench` receives plain values (`bench.fleet.BenchServers`: ready `fleet.pool.Link`s and how to ask why
engines died), so it knows no source either.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
from rich.markup import escape

import fleetgen.cli.app as cli
from fleetgen.bench.fleet import BenchServers
from fleetgen.chattemplate import has_template
from fleetgen.dashboard.fleetdata import EndpointSource, FleetViewSource, planned_max_running_requests
from fleetgen.dashboard.server import FleetSource
from fleetgen.deploy.death import Death
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.readiness import Readiness
from fleetgen.deploy.wanted import refuse_simulated_acceptance
from fleetgen.errors import FleetDown
from fleetgen.fleet.planning import tokenizer_dir_for
from fleetgen.fleet.pool import Link, open_fleet, ready_endpoints
from fleetgen.fleet.status import engine_deaths, open_view
from fleetgen.generate.dispatch import in_flight_for
from fleetgen.generate.fleetlink import fleet_servers, url_servers
from fleetgen.generate.health import JOIN_GRACE_S
from fleetgen.generate.runner import JobServers
from fleetgen.http.urls import BareURLs

DEFAULT_DEAD_TIMEOUT_S = 300.0  # --endpoint URLs: the mid-job wait for a server to come back


@dataclass(frozen=True)
class Servers:
    """What a job runs on (`of_job`: its endpoints and what comes with them), how long it waits for them."""

    of_job: JobServers
    wait_s: float  # no server ready: wait this long for one
    dead_timeout_s: float  # every server gone mid-job: stop after this long (unless --dead-timeout)
    meanwhile: Callable[[float], str]  # what the job does while it waits, for the plain log
    caps: dict[str, int] = field(default_factory=dict)  # the default in flight per server
    fill: frozenset[str] = frozenset()  # servers whose engine runs past its figure: their caps are filled


class ServerSource(Protocol):
    """Where the servers of `run`, `dashboard` and `bench` come from, and what comes with them."""

    async def model_dir(self) -> Path | None:
        """The model folder here whose chat template a run records; None where none holding one is known."""
        ...

    def for_job(
        self, wait_ready: float | None, restart_dead: bool
    ) -> contextlib.AbstractAsyncContextManager[Servers]:
        """The servers held for a job (those not ready yet start drained and join once ready)."""
        ...

    def for_dashboard(self) -> contextlib.AbstractAsyncContextManager[tuple[FleetSource, str]]:
        """The dashboard's rows, read live, and a note to show beside them ("": none)."""
        ...

    def for_bench(self) -> contextlib.AbstractAsyncContextManager[BenchServers]:
        """The ready endpoints a sweep runs on, held open for it, and how to ask why an engine died."""
        ...


def read_servers(fleet_path: Path | None, urls: Sequence[str] | None) -> ServerSource:
    """The servers a command works on, one rule for `run`, `bench` and `dashboard`: the `--endpoint` URLs when
    any are given (a fleet file beside them is not read), else the fleet file (`-f`, else ./fleet.toml), read
    once (`cli.app.read_fleet`). Call it inside `execute`."""
    if urls:
        return URLServers(BareURLs(tuple(urls)))
    return FleetFileServers(cli.read_fleet(fleet_path or Path("fleet.toml")))


@dataclass(frozen=True)
class URLServers:
    """Servers given by URL alone: each named by its address, no key, no plan, no model folder; which engine
    each is shows in what it serves (its /metrics names are probed)."""

    urls: BareURLs

    async def model_dir(self) -> Path | None:
        return None

    @contextlib.asynccontextmanager
    async def for_job(self, wait_ready: float | None, restart_dead: bool) -> AsyncIterator[Servers]:
        say = _meanwhile("the servers", None, False)  # nothing restarts a bare URL
        yield Servers(url_servers(self.urls), wait_ready or 0.0, DEFAULT_DEAD_TIMEOUT_S, say)

    @contextlib.asynccontextmanager
    async def for_dashboard(self) -> AsyncIterator[tuple[FleetSource, str]]:
        async with aiohttp.ClientSession() as http:
            yield EndpointSource(self.urls, http), ""

    @contextlib.asynccontextmanager
    async def for_bench(self) -> AsyncIterator[BenchServers]:
        yield BenchServers([Link(name, url, None, None) for name, url in self.urls.named()], _no_deaths)


async def _no_deaths(names: Sequence[str]) -> Mapping[str, Death]:
    """A bare URL's engine has no log fleetgen reads: a failure stays in its own words."""
    return {}


@dataclass(frozen=True)
class FleetFileServers:
    """The instances `fleetgen up` deployed from a fleet file, reached through tunnels held while used."""

    fleet: Fleet

    async def model_dir(self) -> Path | None:
        """The fleet's tokenizer folder (`tokenizer_dir_for`: read from its first host) where it holds a chat
        template; a folder of the tokenizer alone has nothing to record."""
        found = await tokenizer_dir_for(self.fleet.file, self.fleet.path, offline=False)
        return found if found is not None and has_template(found) else None

    @contextlib.asynccontextmanager
    async def for_job(self, wait_ready: float | None, restart_dead: bool) -> AsyncIterator[Servers]:
        fleet = self.fleet
        refuse_simulated_acceptance(fleet)  # its servers would not write the model's text
        async with open_fleet(fleet) as links:
            at_start = await links.read_all(grace_s=JOIN_GRACE_S)  # a hung one holds no one up
            if not at_start:
                raise FleetDown(
                    f"no instance of {fleet.path} is deployed",
                    fix=f"run `fleetgen up -f {fleet.path}`, then this again",
                )
            wait = fleet.file.engine.ready_timeout_s if wait_ready is None else wait_ready
            _say_not_ready(at_start, fleet.path, wait, restart_dead)
            yield Servers(
                fleet_servers(fleet, links, at_start, restart_dead),
                wait,
                wait,
                _meanwhile(f"the instances of {fleet.path}", fleet.path, restart_dead),
                caps=default_caps(at_start),
                fill=frozenset(e.name for e in at_start if e.running_is_floor),
            )

    @contextlib.asynccontextmanager
    async def for_dashboard(self) -> AsyncIterator[tuple[FleetSource, str]]:
        async with open_view(self.fleet) as view:
            planned, note = await planned_max_running_requests(self.fleet, view.model_host)
            yield FleetViewSource(view, planned), note

    @contextlib.asynccontextmanager
    async def for_bench(self) -> AsyncIterator[BenchServers]:
        async with ready_endpoints(self.fleet) as endpoints:
            yield BenchServers(endpoints, self._deaths)

    async def _deaths(self, names: Sequence[str]) -> Mapping[str, Death]:
        return await engine_deaths(self.fleet, names)


def default_caps(endpoints: list[Link]) -> dict[str, int]:
    """Each server's requests in flight when the job file sets no concurrency: what its engine admits (its
    own view, tuned or not) with a queue beside it (`dispatch.in_flight_for`); a server whose view is not
    read yet (not ready) takes the largest of the others'. Where the view is a floor (vLLM without
    max-num-seqs) the job starts there and fills the batch from the engine's own counts (`Servers.fill`)."""
    return {e.name: in_flight_for(e.max_running_requests) for e in endpoints if e.max_running_requests}


def _say_not_ready(endpoints: list[Link], fleet_path: Path, wait_s: float, restart_dead: bool) -> None:
    """One line per instance not ready at the start (they join once ready), and what waiting for one means."""
    where = escape(str(fleet_path))
    for e in endpoints:
        if e.readiness is Readiness.READY:
            continue
        is_restarted = e.readiness is Readiness.DOWN and restart_dead
        then = "restarting it in the background" if is_restarted else "it joins once ready"
        cli.err_console.print(
            f"[yellow]{e.name} is not ready[/] ({escape(e.problem)}): {then}", highlight=False
        )
    if not any(e.readiness is Readiness.READY for e in endpoints):
        cli.err_console.print(
            f"[yellow]no instance of {where} is ready yet[/]: waiting up to {wait_s:.0f} s for a first one "
            f"(`fleetgen up -f {where}` brings them up, `fleetgen status -f {where}` says why; "
            "--wait-ready S sets the wait)",
            highlight=False,
        )


def _meanwhile(what: str, fleet_path: Path | None, restart_dead: bool) -> Callable[[float], str]:
    """What the job does while no server is ready, given the seconds it still waits."""
    bring = f"`fleetgen up -f {fleet_path}` brings them back" if fleet_path else "start them again"
    if restart_dead:
        bring = "restarting the dead ones (--restart-dead)"
    return lambda wait_s: (
        f"waiting up to {math.ceil(wait_s)} s for one of {what} to come back ({bring}); then the job stops "
        "with FleetDown and prints the command that resumes it"
    )
