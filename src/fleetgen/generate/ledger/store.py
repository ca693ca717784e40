"""The durable store of a job: one SQLite file (WAL) in the output folder.

Tables: `results` (one row per (record id, sample), with the hash of the prompt it answers), `errors` (same
key, with the reason), `inputs_bad` (input, line, reason), `meta` (sampling params, the input's identity,
resume position), `timeseries` (per instance every few seconds, for reports). Schema changes are an
append-only list of migrations (`PRAGMA user_version` counts those applied). Rows say which input of the
folder they come from (`input_index`: 0, then one more per `--add-input`), so a line number means one record
whatever the input file is called now.

**A stored answer is final.** `write_batch` inserts; a row for a stored (id, sample) is a conflict it decides:
the same prompt is a no-op it counts (`Written.repeats`), another prompt is `LedgerConflict` (the batch is not
written) — never a replace. Two exceptions, both on purpose: a success replaces an error row of its key
(`--retry-errors`), and a `--redo-truncated` pass replaces a truncated answer to the same prompt.

The tables, their rows and the migrations are `schema`'s.

Writes come in batches from one writer (`StoreWriter`, which says how often), one transaction each, then
`on_commit` — so whatever the progress counts is already on disk, and a kill -9 leaves either a whole row or
none. Resume reads only the compact `khash` column through a covering index. Every SQLite error (a full disk
above all) is a `JobError` naming the fix; nothing committed is lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from fleetgen.errors import JobError, LedgerConflict
from fleetgen.generate.ledger.schema import (
    BAD,
    ERRORS,
    RESULTS,
    SERIES,
    TABLE_INDEX,
    BadRow,
    ErrorRow,
    R,
    ResultRow,
    SeriesRow,
    Table,
    migrate,
)

DB_NAME = "results.sqlite"
LOCK_NAME = ".fleetgen-run.lock"


@dataclass
class Batch:
    """Rows (and meta items) written in one transaction."""

    results: list[ResultRow] = field(default_factory=list)
    errors: list[ErrorRow] = field(default_factory=list)
    bad: list[BadRow] = field(default_factory=list)
    series: list[SeriesRow] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)

    def rows(self) -> tuple[list[Any], ...]:
        """The rows per table, in `TABLES`' order."""
        return self.results, self.errors, self.bad, self.series

    def __len__(self) -> int:
        return sum(map(len, self.rows()))

    def add(self, row: ResultRow | ErrorRow | BadRow | SeriesRow) -> None:
        """File `row` with the rows of its table."""
        self.rows()[TABLE_INDEX[type(row)]].append(row)


class Counts(NamedTuple):
    """What the store holds."""

    results: int = 0
    errors: int = 0
    truncated: int = 0
    bad_inputs: int = 0


class Written(NamedTuple):
    """What one batch added: rows per table, and the rows its keys already held (no-ops, never replaces)."""

    results: int = 0
    errors: int = 0
    bad: int = 0
    repeats: int = 0


class Stored(NamedTuple):
    """Where a stored row's record was read: its input (`input_index`), line and prompt hash (0: unknown)."""

    input_index: int
    line: int
    chash: int


FULL_DISK_FIX = (
    "free space on the output folder's disk (or check it is writable), then rerun the same command: it "
    "resumes, and nothing committed is lost"
)


@contextlib.contextmanager
def _translated(path: Path, action: str) -> Iterator[None]:
    """SQLite's errors (a full disk above all) as one `JobError` naming the fix."""
    try:
        yield
    except sqlite3.Error as exc:
        raise JobError(f"{action} {path} failed: {exc}", fix=FULL_DISK_FIX) from exc


@dataclass
class Store:
    """The SQLite store of one output folder. Open with `Store.open`; one writer at a time (a lock file)."""

    conn: sqlite3.Connection
    path: Path
    _lock: IO[bytes] | None
    _reader: sqlite3.Connection | None = None

    @classmethod
    def open(cls, out_dir: Path, *, writer: bool = True) -> Store:
        """Open (and create or migrate) the store in `out_dir`; a writer takes the folder's lock."""
        lock = _take_lock(out_dir) if writer else None
        path = out_dir / DB_NAME
        if not writer and not path.is_file():
            raise JobError(
                f"{out_dir} holds no results ({DB_NAME} missing)",
                fix="pass the folder given to `fleetgen run -o`",
            )
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 10000")
            if writer:
                conn.execute("PRAGMA journal_mode = WAL")
                # FULL: a commit is on the platter before the progress counts it (power loss included).
                conn.execute("PRAGMA synchronous = FULL")
                migrate(conn)
        except sqlite3.Error as exc:
            if lock is not None:
                lock.close()
            raise JobError(f"cannot open the store {path}: {exc}", fix=FULL_DISK_FIX) from exc
        return cls(conn, path, lock)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self.conn.close()
        if self._lock is not None:
            self._lock.close()

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, items: dict[str, str]) -> None:
        with _translated(self.path, "writing the job's meta to"):
            self.conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", items.items())

    def delete_meta(self, *keys: str) -> None:
        with _translated(self.path, "writing the job's meta to"):
            self.conn.executemany("DELETE FROM meta WHERE key = ?", ((key,) for key in keys))

    def forget_bad_lines(self) -> None:
        """Drop every bad-input verdict (a folder with nothing generated yet: the input may be fixed)."""
        with _translated(self.path, "writing"):
            self.conn.execute("DELETE FROM inputs_bad")

    def bad_lines(self, input_index: int) -> set[int]:
        """Lines of the folder's input `input_index` recorded as bad input by earlier runs: final verdicts."""
        cursor = self.conn.execute("SELECT line FROM inputs_bad WHERE input_index = ?", (input_index,))
        return {line for (line,) in cursor}

    def done_keys(self, input_index: int, after_line: int = 0) -> dict[int, Stored]:
        """Key (`khash`) → where its record was read, for every result and error row of input `input_index`
        past `after_line`, read through covering indexes."""
        keys: dict[int, Stored] = {}
        for table in ("results", "errors"):
            cursor = self.conn.execute(
                f"SELECT khash, input_index, line, IFNULL(chash, 0) FROM {table} "
                "WHERE line > ? AND input_index = ?",
                (after_line, input_index),
            )
            keys.update((key, Stored(index, line, chash)) for key, index, line, chash in cursor)
        return keys

    def stored_at(self, record_id: str) -> Stored | None:
        """Where the rows of `record_id` were read (any input), on a reader connection of its own: the
        writer's transactions never block it (WAL). Every row of an id is its one owner's."""
        if self._reader is None:
            self._reader = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        for table in ("results", "errors"):
            row = self._reader.execute(
                f"SELECT input_index, line, IFNULL(chash, 0) FROM {table} WHERE id = ? LIMIT 1", (record_id,)
            ).fetchone()
            if row is not None:
                return Stored(*row)
        return None

    def keys_where(self, table: str, where: str = "1") -> set[int]:
        """Keys of the rows of `table` matching `where` (e.g. the error rows, or the truncated results)."""
        return {k for (k,) in self.conn.execute(f"SELECT khash FROM {table} WHERE {where}")}

    def counts(self) -> Counts:
        tables = ("results", "errors", "results WHERE is_truncated = 1", "inputs_bad")  # Counts' order
        counts = ", ".join(f"(SELECT COUNT(*) FROM {table})" for table in tables)
        return Counts._make(self.conn.execute(f"SELECT {counts}").fetchone())

    def write_batch(self, batch: Batch, *, replace_truncated: bool = False) -> Written:
        """Write a batch in one transaction: all of it or none of it. A row whose key is stored is decided
        (the module docstring says how): `LedgerConflict` for another prompt, never a replace."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            written = self._insert_all(batch, replace_truncated)
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", batch.meta.items())
            conn.execute("COMMIT")
        except (sqlite3.Error, LedgerConflict) as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, LedgerConflict):
                raise
            raise JobError(f"writing results to {self.path} failed: {exc}", fix=FULL_DISK_FIX) from exc
        return written

    def _insert_all(self, batch: Batch, replace_truncated: bool) -> Written:
        conn, num_results, num_errors = self.conn, 0, 0
        for result in batch.results:  # one by one: a key twice in one batch is decided as across batches
            if self._is_new_result(result, replace_truncated):
                # A success replaces an earlier error row for the same key (--retry-errors).
                conn.execute("DELETE FROM errors WHERE id = ? AND sample = ?", (result.id, result.sample))
                conn.execute(RESULTS.insert, result)
                num_results += 1
        for error in batch.errors:
            if self._is_new_error(error):
                conn.execute(ERRORS.insert, error)
                num_errors += 1
        before = conn.total_changes
        conn.executemany(f"{BAD.insert} ON CONFLICT (input_index, line) DO NOTHING", batch.bad)
        num_bad = conn.total_changes - before  # a verdict already stored is the same verdict: kept
        conn.executemany(SERIES.insert, batch.series)
        num_rows = len(batch.results) + len(batch.errors) + len(batch.bad)
        return Written(num_results, num_errors, num_bad, num_rows - num_results - num_errors - num_bad)

    def _is_new_result(self, row: ResultRow, replace_truncated: bool) -> bool:
        """Whether `row` is to be inserted: its key holds nothing, an error row (of the same prompt), or with
        `replace_truncated` a truncated answer to the same prompt (deleted here); a stored answer to the same
        prompt makes it a no-op."""
        error = self._stored_chash("errors", row)
        if error is not None:
            self._check_same_prompt(row, error)
        stored = self.conn.execute(
            "SELECT IFNULL(chash, 0), is_truncated FROM results WHERE id = ? AND sample = ?",
            (row.id, row.sample),
        ).fetchone()
        if stored is None:
            return True
        chash, is_truncated = stored
        self._check_same_prompt(row, chash)
        if replace_truncated and is_truncated:
            self.conn.execute("DELETE FROM results WHERE id = ? AND sample = ?", (row.id, row.sample))
            return True
        return False

    def _is_new_error(self, row: ErrorRow) -> bool:
        """Whether `row` is to be inserted: an answer stored for its key stays (the error is a no-op); an
        earlier error row of the same prompt is replaced by this newer one (`--retry-errors`)."""
        for table in ("results", "errors"):
            stored = self._stored_chash(table, row)
            if stored is None:
                continue
            self._check_same_prompt(row, stored)
            if table == "results":
                return False
            self.conn.execute("DELETE FROM errors WHERE id = ? AND sample = ?", (row.id, row.sample))
        return True

    def _stored_chash(self, table: str, row: ResultRow | ErrorRow) -> int | None:
        """The prompt hash stored in `table` for `row`'s key (0: unknown), None when the key holds nothing."""
        stored = self.conn.execute(
            f"SELECT IFNULL(chash, 0) FROM {table} WHERE id = ? AND sample = ?", (row.id, row.sample)
        ).fetchone()
        return None if stored is None else int(stored[0])

    def _check_same_prompt(self, row: ResultRow | ErrorRow, stored_chash: int) -> None:
        if stored_chash and row.chash and stored_chash != row.chash:
            raise LedgerConflict(
                f"{self.path}: record {row.id!r} (sample {row.sample}, {row.source}:{row.line}) is stored "
                "with another prompt; the stored answer is kept and this one is not written",
                fix="this is a fleetgen bug (the input side lets one id through twice): report it with the "
                "folder; rerun the same command to resume",
            )

    def iter_rows(self, table: Table[R], where: str = "1") -> Iterator[R]:
        """Stream the records of `table` matching `where`, in insertion order, 1000 at a time (exports never
        hold a whole table). A column an older store lacks (a reader does not migrate) reads as NULL."""
        have = {name for _, name, *_ in self.conn.execute(f"PRAGMA table_info({table.name})")}
        columns = ", ".join(c if c in have else f"NULL AS {c}" for c in table.record._fields)
        cursor = self.conn.execute(f"SELECT {columns} FROM {table.name} WHERE {where} ORDER BY rowid")
        while rows := cursor.fetchmany(1000):
            yield from map(table.record._make, rows)


def _take_lock(out_dir: Path) -> IO[bytes]:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        handle = (out_dir / LOCK_NAME).open("ab")
    except OSError as exc:
        raise JobError(f"cannot use the output folder {out_dir}: {exc.strerror}", fix=FULL_DISK_FIX) from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise JobError(
            f"another `fleetgen run` is writing {out_dir}",
            fix="wait for it to finish or stop it; two runs on one folder would do work twice",
        ) from exc
    return handle
