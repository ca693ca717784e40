"""Servers that are not ready when a job starts: drained from the start, probed, restarted when dead (only
then), taken in once ready; with none ready, a bounded wait and then FleetDown naming each one's problem.

Servers are stand-ins (see tests/fixtures/standin.py for why). The fleet's per-instance status read (SSH +
/proc + /health, `fleet.pool.FleetLinks.read_one`) is replaced by a scripted `read_one` here, so that each
answer (loading, dead, ready, host unreachable) comes on cue; the real one runs in
tests/integration/generate/test_run_fleet.py over real sshd and fleetgen.sim.

Filed under `generate/health.py` (`HealthMonitor`), with `dispatch.py`'s drain as it meets late servers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from fleetgen.cli.run import render
from fleetgen.deploy.readiness import Judgement, Readiness
from fleetgen.errors import DeployError, FleetDown
from fleetgen.fleet.pool import Link
from fleetgen.generate.dispatch import Dispatcher
from fleetgen.generate.health import Endpoint, HealthMonitor, served_models
from fleetgen.generate.progress import EndpointProgress, Progress
from fleetgen.generate.runner import JobServers
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import EngineClient
from tests.fixtures import until
from tests.fixtures.jobs import FAST, new_job, rows, write_jsonl
from tests.fixtures.standin import StandIn, serve

QUICK = dataclasses.replace(FAST, probe_interval_s=0.02, probe_interval_max_s=0.02, dead_timeout_s=5.0)
HANG_GUARD_S = 30.0  # only against a hung test; never asserted as a speed


async def all_ready(monitor: HealthMonitor) -> None:
    """Return once every endpoint of `monitor` is READY (woken by its `on_ready`)."""
    changed = asyncio.Event()
    monitor.on_ready = changed.set
    while not all(e.readiness is Readiness.READY for e in monitor.endpoints):
        changed.clear()
        await asyncio.wait_for(changed.wait(), HANG_GUARD_S)


async def test_watch_restarts_the_dead_not_the_loading_until_it_dies(tmp_path: Path) -> None:
    """s0 is loading at the start: probed, never restarted while loading; it dies while loading, then it is
    restarted. s1 is dead at the start: restarted at once. Both are taken in once the fleet says ready."""
    admits: dict[str, int] = {"s0": 0, "s1": 0}
    restarted: list[tuple[str, int]] = []  # (name, admits seen for it before the restart)

    async def admit(endpoint: Endpoint) -> Judgement:
        admits[endpoint.name] += 1
        if any(name == endpoint.name for name, _ in restarted):
            return Judgement(Readiness.READY)
        if endpoint.name == "s0" and admits["s0"] < 3:
            return Judgement(Readiness.WAITING, "loading")
        return Judgement(Readiness.DOWN, "not running")

    async def on_dead(name: str) -> None:
        restarted.append((name, admits[name]))

    async with serve(StandIn()) as a, EngineClient(a.url, max_connections=2, timeout_s=5) as client:
        endpoints = [
            Endpoint("s0", client, 2, Readiness.WAITING),
            Endpoint("s1", client, 2, Readiness.DOWN),
        ]
        monitor = HealthMonitor(endpoints, QUICK, on_dead=on_dead, admit=admit)
        try:
            await all_ready(monitor)
        finally:
            await monitor.close()
    assert sorted(name for name, _ in restarted) == ["s0", "s1"]  # each once
    assert dict(restarted)["s0"] == 3  # not while it was loading: only once the fleet said it died
    assert dict(restarted)["s1"] == 0  # dead at the start: restarted before any probe
    assert [e.num_restarts for e in endpoints] == [1, 1]


async def test_no_server_ready_waits_then_fleet_down_names_each_problem() -> None:
    reasons = {"s0": "not running", "s1": "process runs but the health endpoint does not answer 200"}

    async def admit(endpoint: Endpoint) -> Judgement:
        endpoint.last_error = reasons[endpoint.name]
        return Judgement(
            Readiness.DOWN if endpoint.name == "s0" else Readiness.WAITING, reasons[endpoint.name]
        )

    waits: list[float] = []
    async with EngineClient("http://127.0.0.1:9", max_connections=1, timeout_s=1) as nowhere:
        endpoints = [Endpoint(n, nowhere, 1, Readiness.WAITING, last_error="?") for n in reasons]
        monitor = HealthMonitor(endpoints, QUICK, admit=admit)
        try:
            with pytest.raises(FleetDown) as err:
                await served_models(
                    monitor, wait_s=0.3, tick_s=0.05, on_wait=waits.append, is_stopped=lambda: False
                )
        finally:
            await monitor.close()
    assert waits and all(0 < w <= 0.3 for w in waits)
    assert err.value.message.startswith("no server became ready within 0.3 s")
    servers = str(err.value.context["servers"])
    assert "s0 (down): not running" in servers and "s1 (waiting): process runs but" in servers
    assert "fleetgen status" in err.value.fix and "fleetgen up" in err.value.fix


async def test_a_server_not_ready_at_the_start_joins_once_ready_through_its_new_url(tmp_path: Path) -> None:
    """s1's host was unreachable at the start (no URL yet): it starts drained; once the fleet says it is
    ready, at a URL of its own, the job follows it there and gives it work."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(200)])
    seen: list[Progress] = []
    async with serve(StandIn(delay_s=0.02)) as a, serve(StandIn()) as late:

        async def read_one(name: str) -> Link:
            if sum(a.seen.values()) < 20:
                return Link(name, "", None, None, Readiness.WAITING, "cannot reach h1 over SSH")
            return Link(name, late.url, None, None)

        job = new_job(
            tmp_path,
            prompts,
            [a.url, ""],
            policy=QUICK,
            servers=JobServers(
                not_ready={"s1": (Readiness.WAITING, "cannot reach h1 over SSH")}, read_one=read_one
            ),
        )
        summary = await asyncio.wait_for(job.run(seen.append), HANG_GUARD_S)
    assert summary.status == "complete" and summary.results == 200
    got = rows(tmp_path / "out", "SELECT id, instance FROM results")
    assert len(got) == 200 and {i for i, _ in got} == {f"r{i}" for i in range(200)}  # each once
    assert sum(late.seen.values()) > 0 and summary.endpoints["s1"] > 0  # it joined
    first = seen[0].endpoints[1]
    assert (first.readiness, first.last_error) == (
        Readiness.WAITING,
        "cannot reach h1 over SSH",
    )  # shown, with why


async def test_none_ready_at_the_start_waits_for_the_first_then_runs(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(30)])
    calls: list[str] = []
    seen: list[Progress] = []
    async with serve(StandIn()) as a:

        async def read_one(name: str) -> Link:
            calls.append(name)
            if len(calls) > 5:  # loading for the first few reads
                return Link(name, a.url, None, None)
            return Link(name, a.url, None, None, Readiness.WAITING, "loading")

        job = new_job(
            tmp_path,
            prompts,
            [a.url],
            policy=QUICK,
            wait_ready_s=HANG_GUARD_S,
            servers=JobServers(not_ready={"s0": (Readiness.WAITING, "loading")}, read_one=read_one),
        )
        summary = await asyncio.wait_for(job.run(seen.append), HANG_GUARD_S)
    assert summary.status == "complete" and summary.results == 30
    shown = [p for p in seen if p.waiting_s is not None]
    assert shown and shown[0].endpoints[0].readiness is Readiness.WAITING and shown[0].endpoints[0].last_error
    assert seen[-1].waiting_s is None


async def test_stop_while_waiting_for_a_first_server_ends_stopped(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "r0", "prompt": "q"}])

    async def read_one(name: str) -> Link:
        return Link(name, "", None, None, Readiness.DOWN, "not running")

    job = new_job(
        tmp_path,
        prompts,
        [""],
        policy=QUICK,
        wait_ready_s=HANG_GUARD_S,
        servers=JobServers(not_ready={"s0": (Readiness.DOWN, "not running")}, read_one=read_one),
    )
    run = asyncio.create_task(job.run(lambda _p: job.stop()))  # Ctrl-C as soon as the wait shows
    summary = await asyncio.wait_for(run, HANG_GUARD_S)
    assert summary.status == "stopped" and summary.results == 0


def test_the_live_view_shows_waiting_and_down_servers_with_why() -> None:
    client = EngineClient("http://127.0.0.1:9", max_connections=1, timeout_s=1)
    endpoints = [
        Endpoint("h0-0", client, 8, Readiness.WAITING, last_error="loading [model] shards"),
        Endpoint("h0-1", client, 8, Readiness.DOWN, last_error="not running"),
    ]
    console = Console(width=200, record=True)
    waiting = Progress(elapsed_s=1.0, endpoints=[EndpointProgress.of(e) for e in endpoints], waiting_s=42.0)
    console.print(render(waiting))
    text = console.export_text()
    assert "no server is ready: waiting up to 42 s more for one, then the job stops" in " ".join(text.split())
    cells = {
        row[0]: row
        for row in ([c.strip() for c in line.split("│")[1:]] for line in text.splitlines())
        if row and row[0].startswith("h0-")
    }
    assert cells["h0-0"][1] == "waiting" and cells["h0-0"][5] == "loading [model] shards"  # not markup
    assert cells["h0-1"][1] == "down" and cells["h0-1"][5] == "not running"


async def test_a_request_drained_before_its_first_step_goes_back_to_the_queue() -> None:
    """The dispatcher launches requests in one loop turn; another request's connection failure in that turn
    drains their endpoint before they ran a step. Each must leave the in-flight count and go back to the
    queue: a task cancelled before it starts runs none of its body (the job waited forever on "in flight 2",
    seen in the Slurm preemption test)."""
    async with EngineClient("http://127.0.0.1:9", max_connections=2, timeout_s=1) as nowhere:
        endpoints = [Endpoint("s0", nowhere, 4), Endpoint("s1", nowhere, 4)]
        monitor = HealthMonitor(endpoints, QUICK)
        dispatcher = Dispatcher(monitor, lambda work: {}, lambda *_: None, lambda *_: None)
        try:
            works = [
                Work(Record(f"r{i}", "q", i, 0, [[{"role": "user", "content": "q"}]]), 0) for i in range(3)
            ]
            for work in works:
                dispatcher._launch(endpoints[0], work)
            dispatcher._mark_down(endpoints[0])  # the same loop turn: no task has run a step
            await asyncio.gather(*endpoints[0].tasks, return_exceptions=True)
            await asyncio.sleep(0)  # the tasks' done callbacks
            assert dispatcher.num_in_flight == 0 and endpoints[0].in_flight == 0 and not endpoints[0].tasks
            assert sorted(w.record.record_id for w in dispatcher._retries) == ["r0", "r1", "r2"]
            assert endpoints[0].readiness is Readiness.DOWN and dispatcher.num_retrying == 3
        finally:
            await monitor.close()


async def test_a_drained_endpoint_stays_down_while_its_fleet_says_loading_then_joins() -> None:
    """Drained (DOWN), then restarted by someone: the fleet says WAITING (loading) twice, then READY. The live
    view says down until it is back, never "waiting" meanwhile (`decide`: down stays down until ready)."""
    seen: list[Readiness] = []

    async def admit(endpoint: Endpoint) -> Judgement:
        seen.append(endpoint.readiness)
        if len(seen) <= 2:
            return Judgement(Readiness.WAITING, "loading")
        return Judgement(Readiness.READY)

    async with serve(StandIn()) as a, EngineClient(a.url, max_connections=1, timeout_s=5) as client:
        monitor = HealthMonitor(
            [Endpoint("s0", client, 1, Readiness.DOWN, last_error="drained")], QUICK, admit=admit
        )
        try:
            await all_ready(monitor)
        finally:
            await monitor.close()
    assert seen[:3] == [Readiness.DOWN] * 3


async def test_without_engine_samples_the_hung_guard_drains_a_silent_endpoint_whose_health_fails() -> None:
    """No engine samples read (a bare URL without /metrics). Both hold a request with no answer for longer
    than `hung_after_s`: the one whose /health answers is slow (looked at again later), the one whose
    /health fails is hung, and `on_hung` says so."""
    hung: list[tuple[str, str]] = []
    found = asyncio.Event()

    def on_hung(endpoint: Endpoint, why: str) -> None:
        hung.append((endpoint.name, why))
        found.set()

    async with (
        serve(StandIn()) as a,
        EngineClient(a.url, max_connections=1, timeout_s=5) as alive,
        EngineClient("http://127.0.0.1:9", max_connections=1, timeout_s=1) as nowhere,
    ):
        slow, silent = Endpoint("slow", alive, 1, in_flight=1), Endpoint("silent", nowhere, 1, in_flight=1)
        monitor = HealthMonitor(
            [slow, silent], dataclasses.replace(QUICK, hung_after_s=0.2, health_timeout_s=1.0)
        )
        monitor.on_hung = on_hung
        try:
            await asyncio.wait_for(found.wait(), HANG_GUARD_S)
            # judged slow: its silence counts again from then
            await until(lambda: slow.progress_at > 0.0, timeout_s=HANG_GUARD_S, poll_s=0.01)
        finally:
            await monitor.close()
    assert {name for name, _ in hung} == {"silent"}
    assert "1 requests in flight" in hung[0][1] and "looks hung" in hung[0][1]


LOST = "connection to http://127.0.0.1:1 failed: Server disconnected"  # the job's own words for the loss


@pytest.mark.parametrize(
    ("fleet_says", "said_at_restart"),
    [
        (  # a Ray actor killed: `status`'s words, as the placement reads them (`FleetLinks.read_one`)
            Judgement(
                Readiness.DOWN, "Ray lists no actor fleetgen-ray-1 in namespace fleetgen (killed, ...)"
            ),
            "Ray lists no actor fleetgen-ray-1 in namespace fleetgen (killed, ...)",
        ),
        (Judgement(Readiness.DOWN, "not running: CUDA out of memory"), "not running: CUDA out of memory"),
        # its process lives (a request failed; or hung: the job's "no progress for …" says more than the
        # fleet's "health does not answer"), or the fleet cannot be read: the job's own words stay
        (Judgement(Readiness.READY), LOST),
        (Judgement(Readiness.WAITING, "process runs but the health endpoint does not answer 200"), LOST),
        (DeployError("a: the host is unreachable", fix="check ssh"), LOST),
    ],
)
async def test_a_lost_endpoint_is_said_in_its_fleets_words_before_a_restart_replaces_it(
    fleet_says: Judgement | DeployError, said_at_restart: str
) -> None:
    """With `--restart-dead`, the restart replaces what could tell why a server died (its Ray actor, its
    Slurm job): the fleet is asked first, so the run log's "is down" line carries the placement's words."""
    restarted: list[str] = []  # the endpoint's last_error when its restart began

    async def admit(endpoint: Endpoint) -> Judgement:
        if restarted:  # placed again: back
            return Judgement(Readiness.READY)
        if isinstance(fleet_says, DeployError):
            raise fleet_says
        if fleet_says.readiness is not Readiness.READY:  # as `Job._admit` does: its reason to the view
            endpoint.last_error = fleet_says.reason
        return fleet_says

    async def on_dead(name: str) -> None:
        restarted.append(endpoint.last_error)

    async with serve(StandIn()) as a, EngineClient(a.url, max_connections=1, timeout_s=5) as client:
        endpoint = Endpoint("s0", client, 1)
        monitor = HealthMonitor([endpoint], QUICK, on_dead=on_dead, admit=admit)
        try:
            endpoint.last_error = LOST
            monitor.lost(endpoint)
            await until(lambda: bool(restarted), timeout_s=HANG_GUARD_S, poll_s=0.01)
        finally:
            await monitor.close()
    assert restarted == [said_at_restart]
