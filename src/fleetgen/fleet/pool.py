"""The endpoints of a fleet: name, URL (a live tunnel), API key, concurrency.

Tunnels live as long as the SSH connections behind them, and those as long as the context manager that
opened them: `ready_endpoints` (for `bench`) owns the ready instances' connections and closes them when its
block exits; `open_fleet` (for `fleetgen run`) owns every deployed instance, ready or not, and re-reads one
on demand so a job can take it in once ready.

A `Link`'s tunnel is re-opened after a drop; its readiness and problem are read by `FleetView.read`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace

from fleetgen.deploy.death import Death
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.placement import placement_of
from fleetgen.deploy.readiness import Readiness, Seen, decide
from fleetgen.deploy.state import load_state
from fleetgen.errors import FleetDown
from fleetgen.fleet.status import FleetView, InstanceStatus, open_view

NOT_READ = (
    "not read yet (its engine is slow to answer, or hung): the job re-reads it and takes it in once ready"
)


@dataclass(frozen=True)
class Link:
    """One engine as a client reaches it: ready, or (from `FleetLinks`) not yet, and why (`problem`)."""

    name: str
    url: str  # "" while no tunnel could be opened (its host is unreachable)
    api_key: str | None
    max_running_requests: int | None
    readiness: Readiness = Readiness.READY
    problem: str = ""
    running_is_floor: bool = False  # max_running_requests is a floor its engine runs past: `run` fills it


def link_of(s: InstanceStatus, api_key: str | None) -> Link:
    """The link to an instance as its status reads now."""
    return Link(
        s.instance, s.url, api_key, s.max_running_requests, s.readiness, s.problem, s.running_is_floor
    )


@contextlib.asynccontextmanager
async def ready_endpoints(fleet: Fleet, *, only: Sequence[str] | None = None) -> AsyncIterator[list[Link]]:
    """The fleet's ready endpoints, their tunnels open until the block exits (the SSH connections close
    with it); raises FleetDown when none is ready."""
    async with open_view(fleet, only=only) as view:
        statuses = await view.refresh(rate_window_s=0)
        ready = [s for s in statuses if s.readiness is Readiness.READY]  # healthy, no drift
        endpoints = [link_of(s, view.secret) for s in ready]
        if not endpoints:
            detail = "\n".join(f"{s.instance} ({s.readiness.value}): {s.problem}" for s in statuses)
            raise FleetDown(
                "no instance of the fleet is ready",
                context={"instances": detail},
                fix="run `fleetgen up` (then `fleetgen status` to see each instance)",
            )
        yield endpoints


class FleetLinks:
    """Every instance `fleetgen up` deployed, for a job, ready or not, each reached through a tunnel held
    open for the job; `check(name)` re-reads one instance now. Use `open_fleet`."""

    def __init__(self, view: FleetView, stack: contextlib.AsyncExitStack, hosts: Mapping[str, str]) -> None:
        self.fleet = view.fleet
        self.secret = view.secret
        self._hosts = dict(hosts)  # instance → its host's name
        self._stack = stack
        self._views: dict[str, FleetView] = {}
        self._failed = {s.instance: s for s in view.failed}
        self._lock = asyncio.Lock()
        self._adopt(view)

    @property
    def names(self) -> list[str]:
        """The deployed instances, in name order."""
        return sorted(self._hosts)

    async def read_all(self, *, grace_s: float | None = None) -> list[Link]:
        """Every deployed instance as it is now (an unreachable host is not retried here). With `grace_s`
        (a job's start), the reads end `grace_s` after a first instance reads READY: one not read by then
        (a hung engine's /health takes the read's whole timeout) is WAITING, `NOT_READ`, for the job to
        re-read (`read_one`): a new job does not wait on a hung server to start the others."""
        tasks = {name: asyncio.create_task(self._read(name)) for name in self.names}
        try:
            if grace_s is None:
                await asyncio.gather(*tasks.values())
            elif tasks:  # (none deployed: nothing to read)
                await _first_ready(set(tasks.values()))
                await asyncio.wait(tasks.values(), timeout=grace_s)
        finally:
            slow = [task for task in tasks.values() if not task.done()]
            for task in slow:
                task.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
        not_read = decide(Seen(unseen=NOT_READ))
        return [
            task.result()
            if task.done() and not task.cancelled()
            else Link(name, "", self.secret, None, *not_read)
            for name, task in tasks.items()
        ]

    async def read_one(self, name: str) -> Link:
        """One instance as it is now: its host reconnected if it was unreachable (SSH connections that
        dropped reconnect, and re-open their tunnels, on the read itself). A cluster's instance is placed anew
        (alone) when its job was replaced, and when its process is gone: its job's end then reads in
        its cluster's words (Slurm's CANCELLED, PREEMPTED, NODE_FAIL; Ray's actor death cause), not as "not
        running"."""
        host, is_placed = self._hosts[name], placement_of(self.fleet.file).is_per_instance
        one = self._views.get(name)
        if one is not None and one.is_replaced(name):  # its cluster runs it in a new job or actor
            del self._views[name]
        if name not in self._views:
            await self._reconnect(host, only=name if is_placed else "")
        link = await self._read(name)
        if is_placed and link.readiness is Readiness.DOWN and name in self._views:
            del self._views[name]
            await self._reconnect(host, only=name)
            link = await self._read(name)
        return link

    async def death(self, name: str) -> Death | None:
        """Why the instance's engine died, in its own words (`FleetView.death`); None where its log shows no
        error or its host is unreachable."""
        one = self._views.get(name)
        return None if one is None else await one.death(name)

    def _adopt(self, view: FleetView) -> None:
        """The view that reads each instance (`FleetView.read`: that instance only)."""
        for name in view.names:
            if name in self._hosts and name not in self._views:
                self._views[name] = view

    async def _read(self, name: str) -> Link:
        one = self._views.get(name)
        if one is None:  # its host is unreachable, or its job / actor is not running
            failed = self._failed.get(name)
            if failed is None:
                return Link(name, "", self.secret, None, *decide(Seen(unseen="its host is unreachable")))
            return Link(name, "", self.secret, None, failed.readiness, failed.problem)
        s = await one.read(name)
        url = s.url or await one.url_of(name)
        return replace(link_of(s, self.secret), url=url)

    async def _reconnect(self, host: str, only: str = "") -> None:
        """Open `host` again (or just its instance `only`) for the instances without a view."""
        async with self._lock:  # one attempt per host at a time; the others then see its outcome
            if all(
                name in self._views for name, h in self._hosts.items() if h == host and only in ("", name)
            ):
                return
            attempt = contextlib.AsyncExitStack()
            view = await attempt.enter_async_context(open_view(self.fleet, only=[only or host]))
            self._adopt(view)
            self._failed.update({s.instance: s for s in view.failed})
            if view.names:
                await self._stack.enter_async_context(attempt)  # kept open (with its tunnels) for the job
            else:
                await attempt.aclose()


async def _first_ready(reads: set[asyncio.Task[Link]]) -> None:
    """Return once one of `reads` has read a READY instance, or all have ended (an error: raised)."""
    while reads:
        done, reads = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
        if any(task.result().readiness is Readiness.READY for task in done):
            return


@contextlib.asynccontextmanager
async def open_fleet(fleet: Fleet) -> AsyncIterator[FleetLinks]:
    """Every instance of `fleetgen up` state (`.fleetgen/state.json`) that the fleet file still has, for a
    job; SSH connections and tunnels close on exit."""
    records = load_state(fleet.path)
    async with contextlib.AsyncExitStack() as stack:
        view = await stack.enter_async_context(open_view(fleet))
        known = {*view.names} | {s.instance for s in view.failed}
        hosts = {name: rec.host for name, rec in records.items() if name in known}
        yield FleetLinks(view, stack, hosts)
