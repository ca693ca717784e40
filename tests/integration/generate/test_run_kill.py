"""Issue 29's two cases, as the issue reproduced them: a real `fleetgen run` killed with SIGKILL on a real
(simulated) SGLang server, then resumed with the same command.

1. An id repeated 600 lines after its first occurrence, with another prompt: after the kill and the resume the
   first occurrence's answer stays, and line 602 is a duplicate with another prompt (it used to replace it).
2. A duplicate already recorded as bad input while a slow record before it is still in flight: the resume
   completes (it used to stop: "already stored with other content: the input changed").
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from tests.fixtures import until
from tests.fixtures.sim import SimFactory

ARGV = [sys.executable, "-c", "from fleetgen.cli import main; main()", "run"]


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    """The rows `sql` reads from the job's store; none while the run has not made its tables yet."""
    if not (out / "results.sqlite").is_file():
        return []
    with sqlite3.connect(out / "results.sqlite") as conn:
        try:
            return list(conn.execute(sql))
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise


async def run_until(args: list[str], out: Path, condition: str) -> None:
    """`fleetgen run` started, then SIGKILLed as soon as the store answers `condition` (an SQL query that
    returns a row): what it had not committed is gone, as after a crash."""
    proc = await asyncio.create_subprocess_exec(*ARGV, *args, stdout=asyncio.subprocess.DEVNULL)
    try:
        await until(lambda: bool(query(out, condition)), timeout_s=60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()


async def run_to_end(args: list[str]) -> tuple[int, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(*ARGV, *args, "--json", stdout=asyncio.subprocess.PIPE)
    stdout, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, json.loads(stdout)


def write(path: Path, records: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


async def test_a_far_duplicate_after_a_kill_never_replaces_the_first_answer(
    sim_server: SimFactory, tmp_path: Path
) -> None:
    records = [{"id": "X", "prompt": "first"}]
    records += [{"id": f"f{n}", "prompt": f"[[sim:delay=0.05]] filler {n}"} for n in range(600)]
    records.append({"id": "X", "prompt": "LATE"})
    prompts, out = write(tmp_path / "b.jsonl", records), tmp_path / "outb"
    async with sim_server(sim_decode_tps=0) as sim:
        args = [str(prompts), "-o", str(out), "-e", sim.base_url, "--no-live", "--concurrency", "8"]
        # Killed once the position has moved past line 1 (a resume then starts after X's first answer).
        await run_until(
            args, out, "SELECT 1 FROM meta WHERE key = 'position' AND value NOT LIKE '{\"line\":0,%'"
        )
        code, summary = await run_to_end(args)
    assert code == 0 and summary["status"] == "complete"
    assert query(out, "SELECT line, prompt FROM results WHERE id = 'X'") == [
        (1, '[[{"role":"user","content":"first"}]]')
    ]
    assert query(out, "SELECT line, reason FROM inputs_bad") == [
        (602, "duplicate id 'X': first at line 1, with another prompt")
    ]
    assert summary["results"] == 601 and summary["bad_inputs"] == 1
    assert query(out, "SELECT COUNT(*), COUNT(DISTINCT id) FROM results") == [(601, 601)]


async def test_a_resume_is_not_blocked_by_the_jobs_own_duplicate(
    sim_server: SimFactory, tmp_path: Path
) -> None:
    records = [
        {"id": "slow", "prompt": "[[sim:delay=4]] s"},
        {"id": "X", "prompt": "first"},
        {"id": "X", "prompt": "second"},
    ]
    prompts, out = write(tmp_path / "a.jsonl", records), tmp_path / "outa"
    async with sim_server(sim_decode_tps=0) as sim:
        args = [str(prompts), "-o", str(out), "-e", sim.base_url, "--no-live"]
        # Killed with "slow" still in flight, X answered and line 3 judged a duplicate.
        await run_until(
            args, out, "SELECT 1 FROM inputs_bad WHERE line = 3 AND (SELECT COUNT(*) FROM results)"
        )
        assert query(out, "SELECT id, line FROM results") == [("X", 2)]
        code, summary = await run_to_end(args)
    assert code == 0 and summary["status"] == "complete", summary
    assert query(out, "SELECT id, line FROM results ORDER BY line") == [("slow", 1), ("X", 2)]
    assert query(out, "SELECT line, reason FROM inputs_bad") == [
        (3, "duplicate id 'X': first at line 2, with another prompt")
    ]
