"""`fleetgen run` + `export` against the simulated SGLang server (`fleetgen.sim`, real processes on loopback):
reasoning kept apart from the answer, truncation flagged (a success), 429/503 retried, 400 not retried."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.fixtures.sim import SimFactory


def fleetgen(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(out / "results.sqlite") as conn:
        return list(conn.execute(sql))


async def test_run_against_two_sims_then_export(sim_server: SimFactory, tmp_path: Path) -> None:
    records = [{"id": f"r{i}", "prompt": f"question {i}"} for i in range(40)] + [
        {"id": "retry429", "prompt": "a [[sim:status=429:times=2]]"},
        {"id": "retry503", "prompt": "b [[sim:status=503:times=2]]"},
        {"id": "bad400", "prompt": "c [[sim:status=400]]"},
        {"id": "cut", "prompt": "d [[sim:finish=length]]"},
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    flags = dict(reasoning_parser="qwen3", sim_decode_tps=0, sim_output_tokens=64)
    async with sim_server(**flags) as one, sim_server(**flags) as two:
        urls = ["--endpoint", one.base_url, "--endpoint", two.base_url]
        knobs = ["--max-tokens", "256", "--concurrency", "8", "--no-live", "--json"]
        done = fleetgen("run", str(prompts), "-o", str(out), *urls, *knobs)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "complete" and summary["results"] == 43 and summary["errors"] == 1

    rows = {
        r[0]: r[1:]
        for r in query(
            out, "SELECT id, content, reasoning_content, finish_reason, is_truncated, attempts FROM results"
        )
    }
    assert len(rows) == 43
    content, reasoning = rows["r0"][:2]
    assert reasoning and content and "<think>" not in content  # SGLang's reasoning_content kept apart
    assert rows["cut"][2:4] == ("length", 1)  # truncation: a success, flagged
    # Each sim counts failures per message on its own: two sims → 2 to 4 failures before success.
    assert 3 <= rows["retry429"][4] <= 5 and 3 <= rows["retry503"][4] <= 5
    assert query(out, "SELECT id, kind, attempts FROM errors") == [("bad400", "http_400", 1)]  # no retry
    assert {r[0] for r in query(out, "SELECT DISTINCT instance FROM results")} == {
        one.base_url.split("://")[1],
        two.base_url.split("://")[1],
    }
    check_exports(out, tmp_path)


def check_exports(out: Path, tmp_path: Path) -> None:
    """SpecForge sharegpt (truncated rows filtered out) and Parquet with the documented columns."""
    sharegpt = tmp_path / "train.jsonl"
    exported = fleetgen(
        "export", str(out), "--format", "sharegpt", "--to", str(sharegpt), "--filter", "no-truncated"
    )
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in sharegpt.read_text().splitlines()]
    assert len(lines) == 42 and all(row["status"] == "success" for row in lines)
    assistant = lines[0]["conversations"][-1]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] and assistant["content"]

    parquet = tmp_path / "out.parquet"
    assert fleetgen("export", str(out), "--format", "parquet", "--to", str(parquet)).returncode == 0
    table = pq.read_table(parquet)
    assert table.num_rows == 43 and {
        "id",
        "sample",
        "content",
        "reasoning_content",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "instance",
    } <= set(table.column_names)
