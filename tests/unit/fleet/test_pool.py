"""`fleet.pool.FleetLinks.read_all` at a job's start (issue 29 item 7: "a driver started while a server hangs
waits ~10 s before sending anything to the others": the first read of the fleet waited on a hung engine's
/health for the read's whole timeout).

The fleet's view is a FAKE here (`SlowView`): a real `FleetView` needs SSH hosts and launched engines, and
what matters is only how long each instance's read takes, which the fake sets per instance (one never
answers). The real view's reads run in tests/integration/generate/test_run_fleet_down.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import cast

from fleetgen.deploy.readiness import Readiness
from fleetgen.fleet.pool import NOT_READ, FleetLinks
from fleetgen.fleet.status import FleetView, InstanceStatus

HANG_GUARD_S = 30.0  # only against a hung test; never asserted as a speed


class SlowView:
    """What `FleetLinks` reads of a `FleetView`, each instance's read answering after its own delay (None:
    never, a hung engine) with the readiness given."""

    def __init__(self, reads: Mapping[str, tuple[float | None, Readiness]]) -> None:
        self.fleet, self.secret = None, None
        self.failed: list[InstanceStatus] = []
        self.reads = reads
        self.names = sorted(reads)
        self.cancelled: list[str] = []

    async def read(self, name: str) -> InstanceStatus:
        delay, readiness = self.reads[name]
        try:
            await asyncio.sleep(3600 if delay is None else delay)
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        return InstanceStatus(name, "h", (0,), 30000, url=f"http://{name}", readiness=readiness)

    async def url_of(self, name: str) -> str:
        return f"http://{name}"


async def read_all(view: SlowView, grace_s: float | None) -> list[tuple[str, Readiness, str]]:
    async with contextlib.AsyncExitStack() as stack:
        links = FleetLinks(cast(FleetView, view), stack, dict.fromkeys(view.names, "h"))
        got = await asyncio.wait_for(links.read_all(grace_s=grace_s), HANG_GUARD_S)
    return [(link.name, link.readiness, link.problem) for link in got]


async def test_a_hung_instance_holds_no_one_up_at_a_jobs_start() -> None:
    """h0 never answers, h1 reads READY, h2 a moment later (within the grace), h3 reads WAITING (loading):
    the reads end once h1 is in and the grace ran out: h0 is WAITING "not read yet" (the job re-reads it),
    every other as it read; h0's read is stopped, not left running."""
    view = SlowView(
        {
            "h0": (None, Readiness.READY),
            "h1": (0.0, Readiness.READY),
            "h2": (0.05, Readiness.READY),
            "h3": (0.0, Readiness.WAITING),
        }
    )
    got = await read_all(view, grace_s=0.5)
    assert got == [
        ("h0", Readiness.WAITING, NOT_READ),
        ("h1", Readiness.READY, ""),
        ("h2", Readiness.READY, ""),
        ("h3", Readiness.WAITING, ""),
    ]
    assert view.cancelled == ["h0"]


async def test_with_none_ready_yet_every_read_is_waited_for() -> None:
    """No instance reads READY first (all loading): nothing to start with, so every read is waited for, the
    slow one too; without a grace (`tune`, one instance) every read is waited for as before."""
    reads = {"h0": (0.2, Readiness.READY), "h1": (0.0, Readiness.WAITING)}
    assert await read_all(SlowView(reads), grace_s=0.0) == [
        ("h0", Readiness.READY, ""),
        ("h1", Readiness.WAITING, ""),
    ]
    reads = {"h0": (0.2, Readiness.WAITING), "h1": (0.0, Readiness.READY)}
    assert await read_all(SlowView(reads), grace_s=None) == [
        ("h0", Readiness.WAITING, ""),
        ("h1", Readiness.READY, ""),
    ]
    assert await read_all(SlowView({}), grace_s=1.0) == []  # none deployed: `run` says so
