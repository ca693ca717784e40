"""What a job leaves in its store for readers (dashboard, report): total, finished_at, fleet description,
the accept-length time series; and `--restart-dead`'s hook being retried until the endpoint is back.

Jobs run against stand-in servers (see tests/fixtures/standin.py for why a stand-in).

Filed under `generate/jobmeta.py`, with `fleetlink.py`'s `JobServers`."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from fleetgen.config import FleetFile
from fleetgen.errors import DeployError
from fleetgen.generate.fleetlink import fleet_meta, url_servers
from fleetgen.generate.ledger import jobmeta
from fleetgen.generate.ledger.identity import ResumeCheck, identify
from fleetgen.generate.ledger.jobmeta import JobMeta
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.progress import PositionTracker, Progress
from fleetgen.generate.runner import Job, JobServers
from fleetgen.generate.source import Position
from fleetgen.generate.work import RecordShape, RetryPolicy
from fleetgen.http.urls import BareURLs
from tests.fixtures.jobs import FAST, new_job, options, params, write_jsonl
from tests.fixtures.ports import free_port
from tests.fixtures.standin import StandIn, serve

SGLANG_METRICS = """\
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.5
"""


def read_meta(out: Path) -> dict[str, Any]:
    with sqlite3.connect(f"{(out / 'results.sqlite').as_uri()}?mode=ro", uri=True) as conn:
        return {key: _decode(value) for key, value in conn.execute("SELECT key, value FROM meta")}


def _decode(value: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value


def test_fleet_meta_has_the_engine_section_but_never_env_values() -> None:
    fleet_file = FleetFile.model_validate(
        {
            "engine": {
                "kind": "vllm",
                "version": "0.32.0",
                "model": "/m/tiny",
                "tp": 2,
                "args": {"max-num-seqs": 64, "enforce-eager": True},
                "env": {"HF_TOKEN": "hf_secret123"},
            },
            "hosts": [{"name": "g1", "ssh": "local", "gpus": [0, 1, 2, 3]}],
        }
    )
    meta = fleet_meta(fleet_file, Path("fleet.toml"), ["g1-1", "g1-0"])
    assert meta["engine_args"] == {"max-num-seqs": 64, "enforce-eager": True}
    described = meta["fleet"]
    assert (described["kind"], described["version"], described["model"], described["tp"]) == (
        "vllm",
        "0.32.0",
        "/m/tiny",
        2,
    )
    assert described["instances"] == ["g1-0", "g1-1"] and described["env_names"] == ["HF_TOKEN"]
    assert described["file"] == str(Path("fleet.toml").resolve())  # where it ran from, absolute
    assert "hf_secret123" not in orjson.dumps(meta).decode()
    bare = url_servers(BareURLs(("http://127.0.0.1:1/",)))
    assert bare.describe == {"fleet": {"endpoints": ["http://127.0.0.1:1/"]}}
    assert bare.endpoints == [
        ("127.0.0.1:1", "http://127.0.0.1:1")
    ]  # named by its address (http.client.named_urls)


def test_total_counts_work_items_without_bad_lines(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q"}] * 5)
    resume = ResumeCheck(prompts, identify(prompts, None, RecordShape()), None)
    meta = JobMeta(resume, 3, PositionTracker(Position()), {2})
    assert meta.total is None and "total" not in meta.current()  # not counted yet
    meta.num_records = 5
    meta.bad_lines.add(4)
    assert meta.total == (5 - 2) * 3 and orjson.loads(meta.current()["total"]) == 9
    assert JobMeta(resume, 3, None, set()).total is None  # a re-run pass changes no total


async def test_job_stores_total_finish_time_description_and_accept_length(tmp_path: Path) -> None:
    good = [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(30)]
    prompts = write_jsonl(tmp_path / "p.jsonl", [*good[:10], b"{broken", *good[10:], {"id": "x"}])
    out = tmp_path / "out"
    during: list[dict[str, Any]] = []

    def on_progress(progress: Progress) -> None:
        if 0 < progress.done < 60 and not during:
            during.append(read_meta(out))

    server = StandIn(delay_s=0.02, metrics_text=SGLANG_METRICS)
    async with serve(server) as a:
        opts = options(tmp_path, prompts, params=params(samples=2), metrics_interval_s=0.05)
        summary = await Job(opts, url_servers(BareURLs((a.url,)))).run(on_progress)
    assert summary.status == "complete" and summary.results == 60
    assert during and "finished_at" not in during[0]  # while running, the job is not finished
    meta = read_meta(out)
    assert meta["total"] == 60 and type(meta["total"]) is int  # 30 good records × 2 samples; bad lines not
    assert isinstance(meta["finished_at"], float)
    assert meta["fleet"] == {"endpoints": [a.url]}
    with sqlite3.connect(out / "results.sqlite") as conn:
        accept = [a for (a,) in conn.execute("SELECT accept_length FROM timeseries")]
        last = conn.execute("SELECT completions FROM timeseries ORDER BY rowid DESC LIMIT 1").fetchone()
    assert 2.5 in accept  # scraped from /metrics while the job ran
    assert last == (60,)  # a last sample at the end: the series ends at the final count


async def test_finished_at_only_when_the_whole_job_completes(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(200)])
    out = tmp_path / "out"
    async with serve(StandIn(delay_s=0.01)) as a:
        job = new_job(tmp_path, prompts, [a.url])

        def stop_midway(progress: Progress) -> None:
            if progress.done >= 20 and not progress.stopping:
                job.stop()

        stopped = await job.run(stop_midway)
        assert stopped.status == "stopped" and "finished_at" not in read_meta(out)
        # A --retry-errors pass over an unfinished job completes, yet the job is not finished.
        await new_job(tmp_path, prompts, [a.url], mode="retry_errors").run()
        assert "finished_at" not in read_meta(out)
        await new_job(tmp_path, prompts, [a.url]).run()
    meta = read_meta(out)
    assert meta["total"] == 200 and isinstance(meta["finished_at"], float)


def test_begin_clears_finished_at_and_says_whether_it_was_set(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    try:
        assert jobmeta.begin(store, {}) is False
        jobmeta.finish(store)
        assert store.get_meta("finished_at") is not None and store.get_meta("total") == "0"
        assert jobmeta.begin(store, {"fleet": {"endpoints": ["u"]}}) is True
        assert store.get_meta("finished_at") is None and store.get_meta("fleet") == '{"endpoints":["u"]}'
    finally:
        store.close()


async def test_restart_hook_is_retried_until_the_dead_endpoint_is_back(tmp_path: Path) -> None:
    """An endpoint dead at the start: the hook fails once, then brings a server up on its port; the job
    then uses it."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(120)])
    port = free_port()
    revived = StandIn()
    calls: list[str] = []
    started: list[Any] = []

    async def on_dead(name: str) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise DeployError("the engine did not start", fix="look at its log")
        ctx = serve(revived, port)
        await ctx.__aenter__()
        started.append(ctx)

    policy = dataclasses.replace(
        FAST,
        probe_interval_max_s=0.05,
        dead_timeout_s=5.0,
        max_consecutive_failures=RetryPolicy().max_consecutive_failures,
    )
    try:
        async with serve(StandIn(delay_s=0.05)) as alive:
            urls = [alive.url, f"http://127.0.0.1:{port}"]
            job = new_job(tmp_path, prompts, urls, policy=policy, servers=JobServers(on_dead=on_dead))
            summary = await job.run()
    finally:
        for ctx in started:
            await ctx.__aexit__(None, None, None)
    assert summary.status == "complete" and summary.results == 120
    assert calls == ["s1", "s1"]  # retried after the failure, not again once back
    assert sum(revived.seen.values()) > 0 and summary.endpoints["s1"] > 0  # used once back
    assert job._dispatcher is not None
    [_, dead] = job._dispatcher.endpoints
    assert dead.num_restarts == 1 and "restart failed: the engine did not start" in dead.last_error
