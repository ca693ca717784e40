"""`run`'s plain log off a terminal (issue 10 items 10 and 12) and the job's last snapshot: its averages.

The end-to-end case (a real subprocess logging to a file while `fleetgen down` stops the fleet) is
tests/integration/generate/test_run_fleet_down.py; here the log's rules over snapshot sequences, and the
runner's last snapshot against the stand-in servers (tests/fixtures/standin.py).

Filed under `cli/runlog.py`; the last-snapshot test is `generate/progress.py`'s, as the log prints it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from fleetgen.cli.runlog import PlainLog
from fleetgen.deploy.readiness import Readiness
from fleetgen.generate.progress import EndpointProgress, Progress
from tests.fixtures.jobs import FAST, new_job, write_jsonl
from tests.fixtures.standin import StandIn, serve


def snap(
    states: dict[str, tuple[str, str]],
    *,
    done: int = 10,
    waiting_s: float | None = None,
    is_final: bool = False,
    rate: float = 2.0,
) -> Progress:
    endpoints = [EndpointProgress(n, Readiness(s), 0, 4, 0, 0.0, why) for n, (s, why) in states.items()]
    return Progress(
        done=done,
        total=100,
        completions_per_s=rate,
        output_tokens_per_s=50.0,
        eta_s=45.0,
        errors=0,
        truncated=0,
        bad_inputs=0,
        in_flight=0,
        retrying=0,
        elapsed_s=12.0,
        stopping=False,
        endpoints=endpoints,
        waiting_s=waiting_s,
        is_final=is_final,
    )


UP = {"a": ("ready", ""), "b": ("ready", "")}
A_DOWN = {"a": ("down", "connection refused"), "b": ("ready", "")}
ALL_DOWN = {"a": ("down", "connection refused"), "b": ("down", "Server disconnected")}
PROBED = {"a": ("down", "not running"), "b": ("down", "not running")}


def run_log(snapshots: list[Progress], every_s: float = 3600.0) -> list[str]:
    lines: list[str] = []
    log = PlainLog(lines.append, every_s=every_s, meanwhile=lambda s: f"waiting up to {s:.0f} s")
    for p in snapshots:
        log(p)
    return lines


def test_every_instance_down_is_said_once_with_each_reason_then_the_fleets_own_reasons() -> None:
    lines = run_log(
        [
            snap(UP),
            snap(A_DOWN),
            snap(ALL_DOWN, waiting_s=300),
            snap(ALL_DOWN, waiting_s=299),
            snap(PROBED, waiting_s=298),
            snap(PROBED, waiting_s=297),
            snap(A_DOWN),
        ]
    )
    assert lines == [
        "a is down: connection refused; the others go on",
        "every instance is down: waiting up to 300 s",
        "  a (down): connection refused",
        "  b (down): Server disconnected",
        "  a (down): not running",
        "  b (down): not running",
        "a is down: connection refused",  # its reason changed as b came back
        "b is ready again: it takes work",
    ]


def test_the_fleets_own_why_of_one_down_instance_follows_the_failed_requests() -> None:
    """A Slurm job ended under the run: the request says "Server disconnected", the probe then reads
    Slurm's own account (its job CANCELLED), said once."""
    cancelled = {"a": ("down", "Slurm job 12 ended: CANCELLED"), "b": ("ready", "")}
    lines = run_log([snap(UP), snap(A_DOWN), snap(A_DOWN), snap(cancelled), snap(cancelled), snap(UP)])
    assert lines == [
        "a is down: connection refused; the others go on",
        "a is down: Slurm job 12 ended: CANCELLED",
        "a is ready again: it takes work",
    ]


def test_progress_lines_come_every_n_seconds_and_the_last_one_has_the_averages() -> None:
    assert run_log([snap(UP)] * 5, every_s=3600) == []  # within the interval: nothing
    lines = run_log([snap(UP)] * 3, every_s=0)  # due each time: a line each
    assert len(lines) == 3 and all(line.startswith("[0:00:12] 10/100 (10.0%)  2.0 compl/s") for line in lines)
    final = run_log([snap(UP, done=100, is_final=True, rate=1.5)])
    assert len(final) == 1 and "average 1.5 compl/s  50 tok/s" in final[0]
    waiting = run_log([snap(ALL_DOWN, waiting_s=42)], every_s=0)
    assert waiting[-1].endswith("ready 0/2  no server ready: stopping in 42 s")


def test_the_start_up_wait_is_logged_now_and_then_with_each_instances_state() -> None:
    start = dataclasses.replace(
        snap({"a": ("waiting", "loading shards"), "b": ("down", "not running")}, done=0, waiting_s=1700),
        total=None,
    )
    assert run_log([start] * 3, every_s=3600) == []  # `run` itself said it at once; then every N s
    lines = run_log([start] * 2, every_s=0)
    assert (
        lines
        == [
            "[0:00:12] no server ready yet, waiting 1700 s more: a (waiting): loading shards; "
            "b (down): not running"
        ]
        * 2
    )


async def test_the_jobs_last_snapshot_carries_its_averages_not_the_last_windows(tmp_path: Path) -> None:
    """The live view's last frame used to read "0.0 compl/s 0 tok/s" for every finished job."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(30)])
    seen: list[Progress] = []
    async with serve(StandIn(delay_s=0.01)) as a:
        summary = await new_job(tmp_path, prompts, [a.url]).run(seen.append)
    last = seen[-1]
    assert last.is_final and not any(p.is_final for p in seen[:-1])
    assert last.done == 30 and last.completions_per_s > 0 and last.output_tokens_per_s > 0
    average = summary.completions_this_run / last.elapsed_s
    assert abs(last.completions_per_s - average) <= 0.05 * average  # the same job average, both clocks
    (endpoint,) = last.endpoints
    assert abs(endpoint.completions_per_s - average) <= 0.05 * average  # each instance's average too
    assert dataclasses.replace(last, waiting_s=None) == last


async def test_a_server_failing_every_request_is_said_down_once_and_back_once(tmp_path: Path) -> None:
    """Issue 29 item 8: a server whose /health answers 200 while every request gets 500 made the log say
    "is down: HTTP 500" / "ready again" every few seconds. s0 answers 500 to its first 40 requests (the job's,
    then the probes' while it is drained: dozens of probe rounds), then recovers; s1 holds its answers until
    s0 is back, so the job runs through the whole of it. Exactly one "down" line and one "back" line."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(12)])
    policy = dataclasses.replace(FAST, probe_interval_s=0.02, probe_interval_max_s=0.02)
    failing, gated = StandIn(fail_first=40), StandIn(gate=asyncio.Event())
    lines: list[str] = []
    log = PlainLog(lines.append, every_s=3600.0, meanwhile=lambda s: f"waiting up to {s:.0f} s")
    was_down = False

    def on_progress(p: Progress) -> None:
        nonlocal was_down
        log(p)
        s0 = p.endpoints[0]
        was_down = was_down or s0.readiness is Readiness.DOWN
        if was_down and s0.readiness is Readiness.READY and gated.gate is not None:
            gated.gate.set()  # s0 is back: let the job end

    async with serve(failing) as a, serve(gated) as b:
        job = new_job(tmp_path, prompts, [a.url, b.url], policy=policy)
        summary = await asyncio.wait_for(job.run(on_progress), 30.0)  # a guard against a hang only
    assert summary.results == 12 and failing.num_chats > 40  # it failed through, then took work
    s0_lines = [line for line in lines if line.startswith("s0 ")]
    assert len(s0_lines) == 2, lines
    assert s0_lines[0].startswith("s0 is down: HTTP 500: injected 500")
    assert s0_lines[1] == "s0 is ready again: it takes work"
    assert not any(line.startswith("s1 ") for line in lines)
