"""Exactly once, at the ledger: any input with duplicates × any kill point × any resume gives one final store,
the one the input alone decides.

The ledger's own code runs as `generate.runner` runs it — `Intake` (open, plan, work), `rows.RowBuilder`,
`Store.write_batch`, `JobMeta.committed` and its resume position — with the servers left out: the answers
come back in a random order and are committed in random batches, and a kill drops whatever was not committed
(as `kill -9` does). The servers cannot be left in for this: hypothesis tries hundreds of inputs and kill
points, a real run of each would take seconds. `tests/integration/generate/test_run_sim.py` kills the real
CLI on a real (simulated) server for the issue's own cases.

The oracle (`expected`) is written from the README's rules alone, not from the code: the first valid record
of an id owns it; every later valid record with that id is a bad-input row naming the owner's line and
whether the prompts agree; a record that is bad input owns nothing.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgen.errors import InputError
from fleetgen.generate import rows
from fleetgen.generate.ledger import jobmeta
from fleetgen.generate.ledger.intake import Intake
from fleetgen.generate.ledger.jobmeta import JobMeta
from fleetgen.generate.ledger.store import Batch, Store
from fleetgen.generate.progress import Counters
from fleetgen.generate.source import content_id
from fleetgen.generate.work import Work
from fleetgen.http.client import Completion
from tests.fixtures.jobs import options, params

IDS = ["a", "b", "c", "d", "5"]
PROMPTS = ["p0", "p1", "p2"]
# One input line: a record drawn from small pools of ids and prompts (so duplicates near and far, with the
# same and another prompt, are the rule), or one of the shapes real datasets carry that are bad input.
LINE = st.one_of(
    st.builds(lambda i, p: {"id": i, "prompt": p}, st.sampled_from([*IDS, 5]), st.sampled_from(PROMPTS)),
    st.builds(lambda p: {"prompt": p}, st.sampled_from(PROMPTS)),  # no id: its content's hash
    st.builds(lambda i: {"id": i, "prompt": ""}, st.sampled_from(IDS)),  # empty prompt
    st.builds(lambda i, p: {"id": i, "prompt": p}, st.sampled_from(IDS), st.sampled_from([3, None, ["x"]])),
    st.sampled_from([b"{not json", b"", b"[1, 2]", b'{"id": "a"}']),
)


@dataclass
class Sink:
    """Stands in for `StoreWriter` (whose thread and timer a property test cannot drive): rows queue in a
    batch; `commit` writes it with the job's meta and tells the meta, as the writer's loop does."""

    store: Store
    meta: JobMeta
    batch: Batch = field(default_factory=Batch)

    def put(self, *queued: Any) -> None:
        for row in queued:
            self.batch.add(row)

    def commit(self) -> None:
        """Write the batch; the intake never hands the store a row its key already holds."""
        batch, self.batch = self.batch, Batch()
        batch.meta.update(self.meta.current())
        assert self.store.write_batch(batch).repeats == 0
        self.meta.committed(batch)


def answer_to(work: Work) -> str:
    return "answer to " + orjson.dumps(work.record.segments).decode()


def run_once(tmp: Path, prompts: Path, samples: int, rng: random.Random, kill_at: int | None) -> bool:
    """One run of the job, answers in a random order, killed after `kill_at` steps (None: to the end)."""
    store = Store.open(tmp / "out")
    try:
        opts = options(tmp, prompts, params=params(samples=samples))
        intake = Intake.open(store, opts)
        intake.plan(store, Counters())
        jobmeta.begin(store, {})
        sink = Sink(store, JobMeta(intake.resume, samples, intake.tracker, set(intake.verdicts)))
        builder = rows.RowBuilder("m", "h", intake.input_index)
        work: Iterator[Work] | None = intake.work(sink.put)
        in_flight: list[Work] = []
        steps = 0
        while work is not None or in_flight:
            steps += 1
            if steps == kill_at:
                return False  # kill -9: what was not committed is gone
            roll = rng.random()
            if work is not None and len(in_flight) < 8 and roll < 0.5:
                item = next(work, None)
                if item is None:
                    work = None
                else:
                    in_flight.append(item)
            elif in_flight and roll < 0.9:
                done = in_flight.pop(rng.randrange(len(in_flight)))
                done.done.append(Completion(answer_to(done), "", "stop", 1, 1))
                sink.put(builder.result("s0", done, 0.0, 0.0))
            else:
                sink.commit()
        sink.commit()
        jobmeta.finish(store)
        return True
    finally:
        store.close()


def expected(lines: list[Any], samples: int) -> tuple[dict[Any, Any], dict[int, tuple[int, str] | None]]:
    """From the input alone: (id, sample) → (line, prompt), and each bad line → (owner's line, same/another)
    for a duplicate, None for any other bad record."""
    owners: dict[str, tuple[int, str]] = {}
    bad: dict[int, tuple[int, str] | None] = {}
    for number, line in enumerate(lines, 1):
        if line == b"":
            continue  # a blank line is no record
        record = orjson.loads(line) if isinstance(line, bytes) and line.startswith(b'{"') else line
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt:
            bad[number] = None
            continue
        given = record.get("id")
        rid = str(given) if given not in (None, "") else content_id(record)
        if rid in owners:
            first, first_prompt = owners[rid]
            bad[number] = (first, "same" if first_prompt == prompt else "another")
        else:
            owners[rid] = (number, prompt)
    results = {(rid, s): owner for rid, owner in owners.items() for s in range(samples)}
    return results, bad


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines))
    return path


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(LINE, min_size=1, max_size=40),
    samples=st.integers(1, 2),
    kills=st.lists(st.integers(1, 120), max_size=4),
    seed=st.integers(0, 2**32),
)
def test_any_kills_and_resumes_give_the_store_the_input_decides(
    tmp_path_factory: pytest.TempPathFactory, lines: list[Any], samples: int, kills: list[int], seed: int
) -> None:
    tmp = tmp_path_factory.mktemp("job")
    prompts = write_lines(tmp / "p.jsonl", lines)
    rng = random.Random(seed)
    want_results, want_bad = expected(lines, samples)
    if want_bad and not want_results:  # every record bad: the job stops, naming the likely cause
        with pytest.raises(InputError):
            run_once(tmp, prompts, samples, rng, None)
        return
    for kill_at in kills:
        run_once(tmp, prompts, samples, rng, kill_at)
    assert run_once(tmp, prompts, samples, rng, None)
    with sqlite3.connect(tmp / "out" / "results.sqlite") as conn:
        stored = conn.execute("SELECT id, sample, line, prompt, content FROM results").fetchall()
        bad = dict(conn.execute("SELECT line, reason FROM inputs_bad").fetchall())
        num_errors = conn.execute("SELECT COUNT(*) FROM errors").fetchone()[0]
    assert num_errors == 0
    assert {(rid, s): line for rid, s, line, _p, _c in stored} == {k: v[0] for k, v in want_results.items()}
    for rid, sample, _line, prompt, content in stored:  # each answer is its own first occurrence's
        assert orjson.loads(prompt) == [[{"role": "user", "content": want_results[rid, sample][1]}]]
        assert content == "answer to " + prompt
    assert set(bad) == set(want_bad)
    for line, duplicate in want_bad.items():
        if duplicate is not None:
            first, agree = duplicate
            assert (
                f"first at line {first}, with {'the same' if agree == 'same' else 'another'} prompt"
                in bad[line]
            )


def test_the_issues_far_duplicate_after_a_kill_keeps_the_first_answer(tmp_path: Path) -> None:
    """Issue 29's case at the ledger: an id repeated 600 lines later with another prompt, the run killed after
    the first occurrence was committed and the position moved past it; the resume stores nothing for line 602
    but its verdict, and the first answer stays."""
    lines: list[Any] = [{"id": "X", "prompt": "first"}]
    lines += [{"id": f"f{n}", "prompt": f"filler {n}"} for n in range(600)]
    lines.append({"id": "X", "prompt": "LATE"})
    prompts = write_lines(tmp_path / "b.jsonl", lines)
    rng = random.Random(7)
    assert not run_once(tmp_path, prompts, 1, rng, 400)  # killed with the position well past line 1
    with sqlite3.connect(tmp_path / "out" / "results.sqlite") as conn:
        position = orjson.loads(conn.execute("SELECT value FROM meta WHERE key = 'position'").fetchone()[0])
    assert position["line"] > 1
    assert run_once(tmp_path, prompts, 1, rng, None)
    with sqlite3.connect(tmp_path / "out" / "results.sqlite") as conn:
        assert conn.execute("SELECT line, prompt FROM results WHERE id = 'X'").fetchall() == [
            (1, '[[{"role":"user","content":"first"}]]')
        ]
        assert conn.execute("SELECT line, reason FROM inputs_bad").fetchall() == [
            (602, "duplicate id 'X': first at line 1, with another prompt")
        ]


def test_a_record_partly_done_sends_only_the_samples_the_store_lacks(tmp_path: Path) -> None:
    prompts = write_lines(tmp_path / "p.jsonl", [{"id": "X", "prompt": "p"}, {"id": "Y", "prompt": "q"}])
    opts = options(tmp_path, prompts, params=params(samples=3))

    def work_now(answer: bool) -> list[tuple[str, int]]:
        store = Store.open(tmp_path / "out")
        intake = Intake.open(store, opts)
        intake.plan(store, Counters())
        work = list(intake.work(lambda _row: None))
        if answer:  # the second sample of X answered and committed, then the run killed
            done = next(w for w in work if (w.record.record_id, w.sample) == ("X", 1))
            done.done.append(Completion("a", "", "stop", 1, 1))
            store.write_batch(Batch(results=[rows.RowBuilder("m", "h").result("s0", done, 0.0, 0.0)]))
        store.close()
        return [(w.record.record_id, w.sample) for w in work]

    assert len(work_now(answer=True)) == 6
    assert work_now(answer=False) == [("X", 0), ("X", 2), ("Y", 0), ("Y", 1), ("Y", 2)]
