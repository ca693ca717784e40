"""`fleetgen run` off a terminal while the whole fleet goes away (issue 10 items 10 and 12), over REAL sshd
hosts and `fleetgen.sim` instances brought up by `fleetgen up` (see test_run_fleet.py).

The run's stdout and stderr go to files, as under `nohup`: it logs plain progress lines while it works; when
`fleetgen down` stops every instance it says so at once (each instance and why, and what it does: wait up to
--wait-ready, `fleetgen up` brings them back), ends non-zero with FleetDown and the command that resumes it;
that command, after `fleetgen up`, completes the job with every record exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
from pathlib import Path

from tests.fixtures.fleetcli import (
    assert_rows_once,
    cli,
    finish,
    fleetgen,
    query,
    text_appears,
    wait_for_rows,
    write_prompts,
)
from tests.integration.generate.test_run_fleet import (
    INSTANCES,
    fleet,  # noqa: F401 (the fixture)
    instance_pids,
)

WAIT_S = 15  # --wait-ready: how long the job waits for a server once every one is gone
BOUND_S = 120  # a generous bound on "at once" and on every wait here (no timing threshold is asserted)


def run_args(prompts: Path, out: Path, fleet_file: Path, *flags: str) -> list[str]:
    """`fleetgen run`'s argv (without the program) for a job over the fleet, two requests at a time."""
    return [
        "run",
        str(prompts),
        "-o",
        str(out),
        "-f",
        str(fleet_file),
        "--concurrency",
        "2",
        "--max-tokens",
        "64",
        *flags,
    ]


async def test_fleet_down_mid_job_is_said_at_once_then_fleetdown_with_the_resume_command(
    fleet: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 300)
    out = tmp_path / "out"
    log, stdout_path = tmp_path / "run.log", tmp_path / "run.out"
    args = run_args(prompts, out, fleet, "--wait-ready", str(WAIT_S), "--log-every", "1")
    with log.open("wb") as err, stdout_path.open("wb") as std:
        async with fleetgen(*args, stdout=std, stderr=err) as proc:
            await asyncio.wait_for(wait_for_rows(out, 20, proc), BOUND_S)
            await asyncio.wait_for(text_appears(log, " compl/s ", proc), BOUND_S)  # item 12: progress lines
            code, down_out, down_err = await cli("down", "-f", str(fleet))
            assert code == 0, down_out + down_err
            said = await asyncio.wait_for(text_appears(log, "every instance is down", proc), BOUND_S)
            await asyncio.wait_for(proc.wait(), WAIT_S + BOUND_S)
    text = log.read_text()
    assert proc.returncode == 1 and "Traceback" not in text, text
    down_at = said.index("every instance is down")
    block = said[down_at:]
    # the wait left when the line was written: the whole wait, less however long the log took to notice
    waited = re.search(r"waiting up to (\d+) s for one of", block)
    assert waited is not None and WAIT_S - 5 <= int(waited.group(1)) <= WAIT_S, block
    assert f"`fleetgen up -f {fleet}` brings them back" in block
    for name in INSTANCES:
        assert f"  {name} (down): " in block  # each instance, with its reason
    progress_lines = [line for line in text[:down_at].splitlines() if " compl/s " in line]
    assert progress_lines and all(line.startswith("[0:") for line in progress_lines)  # a log, not frames
    assert "\x1b[" not in text  # no cursor movement or colour off a terminal
    last = [line for line in text.splitlines() if " compl/s " in line][-1]
    assert " average " in last and " average 0.0 compl/s" not in last  # the job's average at its end

    assert "error: stopping the job: no endpoint has been healthy" in text
    resume = next(line for line in text.splitlines() if line.startswith("  resume: "))
    argv = shlex.split(resume.removeprefix("  resume: "))
    assert argv[0] == "fleetgen" and argv[1:] == args  # the very command, to run again as it is
    assert stdout_path.read_text() == ""  # no summary: the job did not finish
    done_before = query(out, "SELECT COUNT(*) FROM results")[0][0]
    assert 20 <= done_before < 300

    code, up_out, up_err = await cli("up", "-f", str(fleet))
    assert code == 0, up_out + up_err
    code, stdout, stderr = await cli(*argv[1:], "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["status"] == "complete"
    assert_rows_once(out, 300)  # exactly once, none lost
    assert query(out, "SELECT COUNT(*) FROM errors")[0][0] == 0


async def test_a_hung_instance_is_named_and_its_requests_move_to_the_others(
    fleet: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """An engine that stops answering while its process lives (seen on a GPU: SGLang's scheduler crashed,
    the job sat with 0 completions, printing nothing). Here the instance's process is SIGSTOPped: connections
    are still accepted, nothing answers, /metrics and /health time out. The job says so and goes on with the
    others: its engine's samples stopped moving (no /health asked)."""
    victim = "h0-0"
    prompts = write_prompts(tmp_path / "p.jsonl", 200)
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    args = run_args(prompts, out, fleet, "--hung-after", "5", "--json")
    pid = instance_pids(fleet)[victim]
    with log.open("wb") as err:
        async with fleetgen(*args, stderr=err) as proc:
            await asyncio.wait_for(wait_for_rows(out, 20, proc), BOUND_S)
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.wait_for(text_appears(log, f"{victim} is down: no progress for", proc), BOUND_S)
            finally:
                os.kill(pid, signal.SIGCONT)  # it may come back into the job; the test is about saying it
            stdout, _ = await finish(proc)
    text = log.read_text()
    assert proc.returncode == 0, text
    line = next(line for line in text.splitlines() if line.startswith(f"{victim} is down: "))
    assert "requests in flight: its engine's counters and gauges stand still: the engine looks hung" in line
    assert json.loads(stdout)["status"] == "complete"
    assert_rows_once(out, 200)  # its requests went elsewhere


async def test_a_run_started_while_an_instance_hangs_starts_with_the_others(
    fleet: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 29 item 7: a driver started while a server hangs waited on it (its first read of the fleet, the
    hung engine's /health, to its timeout) before sending anything to the others. h0-0 is SIGSTOPped before
    the run starts: the run says it is not read yet and starts with the others; continued mid-run, it may
    join; the job completes with every record once."""
    victim = "h0-0"
    prompts = write_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    pid = instance_pids(fleet)[victim]
    os.kill(pid, signal.SIGSTOP)
    try:
        with log.open("wb") as err:
            async with fleetgen(*run_args(prompts, out, fleet, "--json"), stderr=err) as proc:
                needle = f"{victim} is not ready (not read yet"
                await asyncio.wait_for(text_appears(log, needle, proc), BOUND_S)
                await asyncio.wait_for(wait_for_rows(out, 10, proc), BOUND_S)
                os.kill(pid, signal.SIGCONT)
                stdout, _ = await finish(proc)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert proc.returncode == 0, log.read_text()
    assert json.loads(stdout)["status"] == "complete"
    assert_rows_once(out, 60)
