"""`fleetgen run` on a REAL vLLM-CPU fleet of two servers (the tiny model), end to end:

- 500 records (incl. multi-turn conversations) plus malformed lines; the driver — a `fleetgen run`
  subprocess — is SIGKILLed at random moments at least 10 times and rerun each time → exactly 500 rows,
  no duplicates, none lost, bad lines as `inputs_bad` rows naming file and line;
- the exports read back with pyarrow and `datasets`, the SpecForge export with SpecForge's own data code;
- one server SIGKILLed mid-run → the job completes on the other.

max_tokens stays small (16) so the suite stays fast on 2 cores; nothing here asserts speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetgen.config import JobFile
from fleetgen.generate.runner import Job, JobServers
from fleetgen.generate.work import JobOptions, SamplingParams
from tests.fixtures.specforge_oracle import (
    assert_specforge_keeps_every_turn,
    read_with_specforge,
    specforge_tools,
)
from tests.fixtures.vllm import TinyModel, VllmServer, running_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_RECORDS = 500
NUM_MULTI_TURN = 5
MIN_KILLS = 10


def query(out: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(out / "results.sqlite") as conn:
        return list(conn.execute(sql))


def driver_argv(prompts: Path, out: Path, urls: list[str], job: Path) -> list[str]:
    endpoints = [arg for url in urls for arg in ("--endpoint", url)]
    cli = [sys.executable, "-c", "from fleetgen.cli import main; main()"]
    knobs = ["--job", str(job), "--max-tokens", "16", "--concurrency", "4", "--no-live", "--json"]
    return [*cli, "run", str(prompts), "-o", str(out), *endpoints, *knobs]


@pytest.fixture(scope="module")
def second_server(
    vllm_python: Path, tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """A second vLLM-CPU server (the session one is the first): a fleet of two. The last test kills it."""
    with running_vllm_server(vllm_python, tiny_model.path, tmp_path_factory.mktemp("vllm-2")) as server:
        yield server


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> tuple[Path, Path]:
    """500 good records (5 multi-turn) with 3 malformed lines among them, and a job file."""
    folder = tmp_path_factory.mktemp("job")
    lines = [
        orjson.dumps({"id": f"r{i}", "prompt": f"Write about topic number {i}."})
        for i in range(NUM_RECORDS - NUM_MULTI_TURN)
    ]
    for i in range(NUM_MULTI_TURN):
        conv = [
            {"from": "human", "value": f"first question {i}"},
            {"from": "gpt", "value": "old answer"},
            {"from": "human", "value": f"second question {i}"},
            {"from": "gpt", "value": "old"},
            {"from": "human", "value": f"third question {i}"},
        ]
        lines.append(orjson.dumps({"id": f"mt{i}", "conversations": conv}))
    lines[100:100] = [b'{"id": "broken", "prompt": ']  # line 101
    lines[200:200] = [orjson.dumps({"id": "nofield", "text": "no prompt here"})]  # line 201
    lines[300:300] = [orjson.dumps({"id": "empty", "messages": []})]  # line 301
    prompts = folder / "prompts.jsonl"
    prompts.write_bytes(b"\n".join(lines) + b"\n")
    # A random-weight model rarely closes </think>; a small bias on it gives rows with both parts.
    think_end = tiny_model.token_ids["</think>"]
    job = folder / "job.toml"
    job.write_text(f'temperature = 0.8\nseed = 1\n[extra_body.logit_bias]\n"{think_end}" = 6\n')
    return prompts, job


def _num_rows(out: Path) -> int:
    try:  # a driver killed while creating the store leaves a file with no table yet: no rows
        return query(out, "SELECT COUNT(*) FROM results")[0][0] if (out / "results.sqlite").exists() else 0
    except sqlite3.OperationalError:
        return 0


def _turns_stored(out: Path) -> int:
    """The requests the stored rows answered: one per turn of each row (a multi-turn record is several)."""
    try:
        return int(query(out, "SELECT IFNULL(SUM(num_turns), 0) FROM results")[0][0])
    except sqlite3.OperationalError:  # killed before the store had its tables
        return 0


def _answered(servers: list[VllmServer]) -> int:
    """Chat requests the servers answered (vLLM's `request_success` for `stop` and `length`: not the ones
    aborted by a killed client), read once neither has a request running or waiting: a killed driver's last
    requests are answered or aborted before the count is taken."""
    deadline = time.monotonic() + 120
    while True:
        answered, busy = 0.0, 0.0
        for server in servers:
            with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as response:
                text = response.read().decode()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "vllm:request_success_total" and sample.labels.get(
                        "finished_reason"
                    ) in ("stop", "length"):
                        answered += sample.value
                    elif sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                        busy += sample.value
        if not busy:
            return int(answered)
        assert time.monotonic() < deadline, f"the servers still run {busy} requests of a killed driver"
        time.sleep(0.2)


def _kill_at_a_random_moment(proc: subprocess.Popen[bytes], out: Path, rng: random.Random) -> bool:
    """SIGKILL the driver once it has stored a random 1–20 more rows, or after a random 1–4 s (start-up and
    resume included), whichever comes first. Tying the moment to progress, not only to the clock, keeps the
    job from finishing in fewer than MIN_KILLS runs however fast the servers are. False if it exited first."""
    start_rows, target, deadline = (
        _num_rows(out),
        rng.randint(1, 20),
        time.monotonic() + rng.uniform(1.0, 4.0),
    )
    while proc.poll() is None:
        if _num_rows(out) - start_rows >= target or time.monotonic() >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return True
        time.sleep(rng.uniform(0.01, 0.06))
    return False


class KilledJob(NamedTuple):
    """The killed-and-rerun job: its folder, the kills, the rows stored after each, and what the run that
    completed it asked of the servers (requests answered) against what it added to the store (turns)."""

    out: Path
    kills: int
    rows_after_kill: list[int]
    answered_last_run: int
    turns_added_last_run: int


@pytest.fixture(scope="module")
def killed_job(
    vllm_server: VllmServer,
    second_server: VllmServer,
    job_inputs: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> KilledJob:
    """Run the job with the driver SIGKILLed ≥ 10 times at random moments; rerun until it completes."""
    prompts, job = job_inputs
    out = tmp_path_factory.mktemp("killed") / "out"
    servers = [vllm_server, second_server]
    argv = driver_argv(prompts, out, [s.base_url for s in servers], job)
    seed = int(time.time())
    rng = random.Random(seed)
    kills, rows_after_kill = 0, []
    for _ in range(100):
        answered_before, turns_before = _answered(servers), _turns_stored(out)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        if kills < MIN_KILLS and _kill_at_a_random_moment(proc, out, rng):
            kills += 1
            rows_after_kill.append(_num_rows(out))
            continue
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"seed {seed}: driver failed:\n{stderr.decode()[-3000:]}"
        assert kills >= MIN_KILLS, f"seed {seed}: the job finished after only {kills} kills"
        answered = _answered(servers) - answered_before
        return KilledJob(out, kills, rows_after_kill, answered, _turns_stored(out) - turns_before)
    pytest.fail(f"seed {seed}: the job did not complete")


def test_exactly_once_after_repeated_sigkill(killed_job: KilledJob) -> None:
    out, kills, rows_after_kill = killed_job.out, killed_job.kills, killed_job.rows_after_kill
    assert kills >= MIN_KILLS
    assert rows_after_kill == sorted(rows_after_kill)  # committed rows survive every kill
    keys = query(out, "SELECT id, sample FROM results")
    assert len(keys) == len(set(keys)) == NUM_RECORDS  # none lost (the schema keeps keys unique)
    # Done work is not sent again: every request the completing run had answered became a turn of a row
    # the store lacked (a re-sent record would be answered and upserted over itself, adding no turn).
    assert killed_job.answered_last_run == killed_job.turns_added_last_run
    assert query(out, "SELECT COUNT(*) FROM errors") == [(0,)]
    torn = query(
        out,
        "SELECT COUNT(*) FROM results WHERE finish_reason IS NULL OR completion_tokens IS NULL "
        "OR instance IS NULL OR prompt IS NULL",
    )
    assert torn == [(0,)]
    # vLLM 0.32 names the trace `reasoning`: it is stored as reasoning_content, apart from the answer.
    assert query(out, "SELECT COUNT(*) FROM results WHERE reasoning_content != ''")[0][0] > NUM_RECORDS // 2
    assert len({r[0] for r in query(out, "SELECT DISTINCT instance FROM results")}) == 2


def test_malformed_lines_become_error_rows(killed_job: KilledJob) -> None:
    out = killed_job.out
    bad = query(out, "SELECT source, line, reason FROM inputs_bad ORDER BY line")
    assert [(line, reason.split(":")[0]) for _, line, reason in bad] == [
        (101, "malformed JSON"),
        (201, "missing field"),
        (301, "empty messages"),
    ]
    assert all(source.endswith("prompts.jsonl") for source, _, _ in bad)


def test_multi_turn_regenerated_in_order(killed_job: KilledJob) -> None:
    out = killed_job.out
    rows = query(out, "SELECT prompt, turns, num_turns, content FROM results WHERE id LIKE 'mt%'")
    assert len(rows) == NUM_MULTI_TURN
    for prompt, turns, num_turns, content in rows:
        segments, answers = orjson.loads(prompt), orjson.loads(turns)
        assert num_turns == 3 and len(answers) == 3 and answers[-1]["content"] == content
        assert [s[-1]["content"].split()[0] for s in segments] == ["first", "second", "third"]
        assert all(a["completion_tokens"] for a in answers)


def test_exports_read_back_with_pyarrow_and_datasets(killed_job: KilledJob, tmp_path: Path) -> None:
    out = killed_job.out
    parquet, jsonl, sharegpt = tmp_path / "r.parquet", tmp_path / "r.jsonl", tmp_path / "sg.jsonl"
    cli = [sys.executable, "-c", "from fleetgen.cli import main; main()", "export", str(out)]
    # sharegpt with the reasoning inline: vLLM's qwen3 parser finds no <think> in the tiny model's output (the
    # template opens it), so the trace stays in the answer; split rows would all be dropped as leaked/unsplit.
    for fmt, path, more in (
        ("parquet", parquet, []),
        ("jsonl", jsonl, []),
        ("sharegpt", sharegpt, ["--inline-think"]),
    ):
        done = subprocess.run(
            [*cli, "--format", fmt, "--to", str(path), *more], capture_output=True, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
    table = pq.read_table(parquet)
    assert table.num_rows == NUM_RECORDS
    assert {
        "id",
        "sample",
        "content",
        "reasoning_content",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "instance",
    } <= set(table.column_names)
    import datasets  # a dev dependency: the consumer's reader, imported only here

    loaded = datasets.load_dataset("parquet", data_files=str(parquet), cache_dir=str(tmp_path / "hf"))[
        "train"
    ]
    assert loaded.num_rows == NUM_RECORDS and sorted(loaded["id"]) == sorted(table.column("id").to_pylist())
    assert sum(1 for _ in jsonl.open()) == NUM_RECORDS
    for line in sharegpt.read_text().splitlines():
        row = json.loads(line)
        roles = [m["role"] for m in row["conversations"]]
        assert row["status"] == "success" and roles[-1] == "assistant" and roles[0] == "user"


@pytest.mark.specforge
def test_the_specforge_export_of_real_vllm_rows_reads_in_specforges_own_code(
    killed_job: KilledJob, tmp_path: Path
) -> None:
    """The real engine's text (the tiny model's own tokens, multi-turn answers sent back as history) exported
    for SpecForge and read by SpecForge 0.2.0's preprocessing: every row, every assistant turn kept, with
    tokens under the loss mask. Inline think: vLLM's parser leaves the tiny model's trace in the answer."""
    specforge = specforge_tools()
    path = tmp_path / "sg.jsonl"
    cli = [sys.executable, "-c", "from fleetgen.cli import main; main()", "export", str(killed_job.out)]
    done = subprocess.run(
        [*cli, "--format", "sharegpt", "--to", str(path), "--inline-think"], capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    rows = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert len(rows) == NUM_RECORDS
    assert sum(sum(m["role"] == "assistant" for m in r["conversations"]) == 3 for r in rows) == NUM_MULTI_TURN
    assert_specforge_keeps_every_turn(rows, read_with_specforge(path, specforge))


async def test_server_killed_mid_run_job_completes_on_the_other(
    vllm_server: VllmServer, second_server: VllmServer, tmp_path: Path
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"k{i}", "prompt": f"Tell me about {i}."}) + "\n" for i in range(150))
    )
    params = SamplingParams.of(JobFile(max_tokens=16, temperature=0.8, top_p=1.0))
    out = tmp_path / "out"
    fleet = [("one", vllm_server.base_url), ("two", second_server.base_url)]
    options = JobOptions(input_path=prompts, out_dir=out, params=params, concurrency=4)
    task = asyncio.create_task(Job(options, JobServers(fleet)).run())
    while not (out / "results.sqlite").exists() or query(out, "SELECT COUNT(*) FROM results")[0][0] < 20:
        assert not task.done(), task
        await asyncio.sleep(0.2)
    os.killpg(second_server.pid, signal.SIGKILL)  # the whole server: API process and engine core
    summary = await asyncio.wait_for(task, 600)
    assert summary.status == "complete" and summary.results == 150 and summary.errors == 0
    per_instance = dict(query(out, "SELECT instance, COUNT(*) FROM results GROUP BY instance"))
    assert per_instance["one"] > 0 and per_instance.get("two", 0) < 150 and sum(per_instance.values()) == 150
