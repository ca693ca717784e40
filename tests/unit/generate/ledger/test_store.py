"""`generate.store`: migrations, one writer per folder, all-or-nothing batches, each table's record round
trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetgen.errors import JobError
from fleetgen.generate import rows as rowmod
from fleetgen.generate.ledger.store import (
    BAD,
    ERRORS,
    MIGRATIONS,
    RESULTS,
    SERIES,
    TABLES,
    BadRow,
    Batch,
    ErrorRow,
    SeriesRow,
    Store,
)
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import Completion, RequestFailed


def test_migrations_apply_once_and_upserts_are_idempotent(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    version = store.conn.execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS)
    work = Work(Record("a", "f", 3, 0, [[{"role": "user", "content": "q"}]]), 0)
    work.done.append(Completion("x", "r", "length", 4, 9))
    row = rowmod.RowBuilder("m", "h").result("s0", work, 0.0, 0.1)
    store.write_batch(Batch(results=[row, row]))
    store.write_batch(Batch(results=[row], meta={"k": "v"}))
    assert store.counts().results == 1 and store.counts().truncated == 1 and store.get_meta("k") == "v"
    assert store.done_keys() == {work.key: 0} and store.done_keys(after_line=3) == {}
    store.close()
    Store.open(tmp_path).close()  # reopening migrates nothing twice


def test_one_writer_per_folder(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with pytest.raises(JobError, match="another `fleetgen run`"):
        Store.open(tmp_path)
    store.close()


def test_failed_batch_writes_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    good = ErrorRow("a", 0, 1, "f", 1, "http_500", "bad", 500, 1, "s0", 0.0, 7)
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
        errors.append(builder.error(text, work, RequestFailed(text, url="u", status=None, is_retryable=True)))
    bad = [BadRow(text, i, None if i else text, text, 0.0) for i, text in enumerate(UGLY)]
    series = [SeriesRow(float(i), text, i, 2**63 - 1, -i, None if i else 2.5) for i, text in enumerate(UGLY)]
    store.write_batch(Batch(results=results, errors=errors, bad=bad, series=series))
    assert list(store.iter_rows(RESULTS)) == results and list(store.iter_rows(ERRORS)) == errors
    assert list(store.iter_rows(BAD)) == bad and list(store.iter_rows(SERIES)) == series
    # Rows are upserted on their key: writing them again adds no row.
    store.write_batch(Batch(results=[r._replace(content="again") for r in results], bad=bad))
    assert [r.content for r in store.iter_rows(RESULTS)] == ["again"] * 3 and store.counts().bad_inputs == 3
    assert store.counts().errors == 0  # a result replaces the error row of its key (--retry-errors)
    store.close()
