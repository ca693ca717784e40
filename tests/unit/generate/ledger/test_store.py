"""`generate.ledger.store`: migrations, one writer per folder, all-or-nothing batches, each table's record
round trip, a stored answer final (never replaced), SQLite's errors as one `JobError`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.errors import JobError, LedgerConflict
from fleetgen.generate import rows as rowmod
from fleetgen.generate.ledger import jobmeta
from fleetgen.generate.ledger.intake import Intake
from fleetgen.generate.ledger.schema import (
    BAD,
    ERRORS,
    MIGRATIONS,
    RESULTS,
    SERIES,
    TABLES,
    BadRow,
    ErrorRow,
    ResultRow,
    SeriesRow,
)
from fleetgen.generate.ledger.store import Batch, Store, Stored, Written
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import Completion, RequestFailed
from tests.fixtures import skip_or_fail
from tests.fixtures.fulldisk import fill, small_disk
from tests.fixtures.jobs import options


def test_migrations_apply_once_and_a_repeated_row_is_a_counted_no_op(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    version = store.conn.execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS)
    work = Work(Record("a", "f", 3, 0, [[{"role": "user", "content": "q"}]], content_hash=5), 0)
    work.done.append(Completion("x", "r", "length", 4, 9))
    row = rowmod.RowBuilder("m", "h", input_index=2).result("s0", work, 0.0, 0.1)
    assert store.write_batch(Batch(results=[row, row])) == Written(results=1, repeats=1)
    assert store.write_batch(Batch(results=[row], meta={"k": "v"})) == Written(repeats=1)
    assert store.counts().results == 1 and store.counts().truncated == 1 and store.get_meta("k") == "v"
    assert store.done_keys(2) == {work.key: Stored(2, 3, 5)} and store.done_keys(2, after_line=3) == {}
    assert (
        store.done_keys(0) == {} and store.stored_at("a") == Stored(2, 3, 5) and store.stored_at("b") is None
    )
    store.close()
    Store.open(tmp_path).close()  # reopening migrates nothing twice


# One write of the property test below: (record id, sample, prompt hash, kind, content).
WRITE = st.tuples(
    st.sampled_from(["a", "b"]),
    st.integers(0, 1),
    st.sampled_from([11, 22]),
    st.sampled_from(["result", "error"]),
    st.sampled_from(["x", "y"]),
)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(WRITE, min_size=1, max_size=4), max_size=6))
def test_a_stored_answer_is_final(tmp_path_factory: pytest.TempPathFactory, batches: list[Any]) -> None:
    """Invariant, for any sequence of batches: a stored answer is never replaced (a row for its key with the
    same prompt is a counted no-op, an error never covers it, another prompt is `LedgerConflict` and its whole
    batch is not written); a result replaces an error row of the same prompt (`--retry-errors`)."""
    store = Store.open(tmp_path_factory.mktemp("s"))
    held: dict[tuple[str, int], tuple[str, int, str]] = {}  # what the store must hold: key → kind, hash, text
    for writes in batches:
        batch, after, conflict = Batch(), dict(held), False
        for rid, sample, chash, kind, text in writes:
            key = (rid, sample)
            if key in after and after[key][1] != chash:
                conflict = True
            elif key not in after or (kind, after[key][0]) in {("result", "error"), ("error", "error")}:
                after[key] = (kind, chash, text)
            if kind == "result":
                batch.results.append(_result(rid, sample, chash, text))
            else:
                batch.errors.append(ErrorRow(rid, sample, 0, "f", 1, text, text, 500, 1, "s0", 0.0, chash, 0))
        if conflict:
            with pytest.raises(LedgerConflict):
                store.write_batch(batch)
        else:
            store.write_batch(batch)
            held = after
        stored = {(r.id, r.sample): ("result", r.chash, r.content) for r in store.iter_rows(RESULTS)}
        stored |= {(r.id, r.sample): ("error", r.chash, r.kind) for r in store.iter_rows(ERRORS)}
        assert stored == held
    store.close()


def test_redo_truncated_replaces_only_a_truncated_answer_to_the_same_prompt(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    truncated, whole = _result("a", 0, 7, "cut", truncated=True), _result("b", 0, 7, "whole")
    store.write_batch(Batch(results=[truncated, whole]))
    again = [_result("a", 0, 7, "longer"), _result("b", 0, 7, "other")]
    assert store.write_batch(Batch(results=again)) == Written(repeats=2)  # a plain run replaces nothing
    assert store.write_batch(Batch(results=again), replace_truncated=True) == Written(results=1, repeats=1)
    assert [r.content for r in store.iter_rows(RESULTS)] == ["whole", "longer"]
    with pytest.raises(LedgerConflict):
        store.write_batch(Batch(results=[_result("a", 0, 8, "another prompt")]), replace_truncated=True)
    store.close()


def _result(rid: str, sample: int, chash: int, content: str, *, truncated: bool = False) -> ResultRow:
    work = Work(Record(rid, "f", 1, 0, [[{"role": "user", "content": "q"}]], content_hash=chash), sample)
    work.done.append(Completion(content, "", "length" if truncated else "stop", 1, 1))
    return rowmod.RowBuilder("m", "h").result("s0", work, 0.0, 0.1)


def test_one_writer_per_folder(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with pytest.raises(JobError, match="another `fleetgen run`"):
        Store.open(tmp_path)
    store.close()


def test_failed_batch_writes_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    good = ErrorRow("a", 0, 1, "f", 1, "http_500", "bad", 500, 1, "s0", 0.0, 7, 0)
    too_short: Any = ("f", 1, None)  # a row the table refuses (too few columns), after a good one
    with pytest.raises(JobError, match="writing results"):
        store.write_batch(Batch(errors=[good], bad=[too_short]))
    assert store.counts().errors == 0
    store.close()


UGLY = ("", "é\x00😀'\"; DROP TABLE results; --", "x" * 100_000)


def test_each_table_holds_exactly_its_record_and_gives_it_back(tmp_path: Path) -> None:
    """A record's fields are its table's columns in order (a migration adding a column adds the field), and
    any record written comes back equal, whatever its text and numbers."""
    store = Store.open(tmp_path)
    for table in TABLES:
        columns = tuple(row[1] for row in store.conn.execute(f"PRAGMA table_info({table.name})"))
        assert columns == table.record._fields, table.name
    builder = rowmod.RowBuilder("m\x00é", "h")
    results, errors = [], []
    for i, text in enumerate(UGLY):  # built as a run builds them: one, two and three turns
        segments = [[{"role": "user", "content": text}]] * (i + 1)
        work = Work(Record(f"r{i}{text}", text, 2**62 + i, 0, segments, content_hash=-(2**63) + i), i)
        work.done.extend(Completion(text, text, "length" if i else "stop", None, 2**40) for _ in range(i + 1))
        results.append(builder.result(text, work, 0.5, 1e-300))
        failed = dataclasses.replace(work, record=dataclasses.replace(work.record, record_id=f"e{i}{text}"))
        errors.append(
            builder.error(text, failed, RequestFailed(text, url="u", status=None, is_retryable=True))
        )
    bad = [BadRow(text, i, None if i else text, text, 0.0, i) for i, text in enumerate(UGLY)]
    series = [SeriesRow(float(i), text, i, 2**63 - 1, -i, None if i else 2.5) for i, text in enumerate(UGLY)]
    store.write_batch(Batch(results=results, errors=errors, bad=bad, series=series))
    assert list(store.iter_rows(RESULTS)) == results and list(store.iter_rows(ERRORS)) == errors
    assert list(store.iter_rows(BAD)) == bad and list(store.iter_rows(SERIES)) == series
    # A stored row is final: writing it again (other text, same prompt) adds and changes nothing.
    written = store.write_batch(Batch(results=[r._replace(content="again") for r in results], bad=bad))
    assert written == Written(repeats=6) and list(store.iter_rows(RESULTS)) == results
    assert list(store.iter_rows(BAD)) == bad
    retried = [r._replace(id=e.id, sample=e.sample) for r, e in zip(results, errors, strict=True)]
    assert store.write_batch(Batch(results=retried)) == Written(results=3)
    assert store.counts().errors == 0  # a result replaces the error row of its key (--retry-errors)
    store.close()


def test_every_write_on_a_full_disk_is_one_clean_error_and_loses_nothing(tmp_path: Path) -> None:
    """A real full disk (a small tmpfs, filled): every way a run writes — the job's meta at its start
    (`Intake.open`, `jobmeta.begin`), a batch, the end (`jobmeta.finish`) — is one `JobError` that names the
    fix; what was committed before is all there, and once space is freed the same store writes again."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'{"id": "a", "prompt": "q"}\n')
    disk = tmp_path / "disk"
    with small_disk(disk) as why_not:
        if why_not is not None:
            skip_or_fail("a full disk (a small tmpfs)", why_not)
        store = Store.open(disk / "out")
        store.write_batch(Batch(results=[_result(f"r{i}", 0, 1, "x") for i in range(50)]))
        filler = disk / "filler"
        fill(filler)
        writes: dict[str, Callable[[], object]] = {
            "set_meta": lambda: store.set_meta({"k": "v" * 5000}),
            "write_batch": lambda: store.write_batch(Batch(results=[_result("new", 0, 1, "x" * 5000)])),
            "begin": lambda: jobmeta.begin(store, {"fleet": "f" * 5000}),
            "open": lambda: Intake.open(store, options(disk, prompts)),
            "finish": lambda: jobmeta.finish(store),
        }
        failed = []
        for name, write in writes.items():
            try:
                write()
            except JobError as exc:
                assert "rerun the same command" in exc.fix, name
                failed.append(name)
        try:
            with pytest.raises(JobError) as error:
                store.write_batch(Batch(results=[_result("n", 0, 1, "y" * 9000)]))
            assert "disk is full" in str(error.value) and "rerun the same command" in error.value.fix
            assert store.counts().results == 50
            filler.unlink()
            assert store.write_batch(Batch(results=[_result("n", 0, 1, "y")])) == Written(results=1)
        finally:
            store.close()
    assert failed == list(writes)
