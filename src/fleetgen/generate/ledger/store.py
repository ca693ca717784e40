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

A row of a table is a named record (`ResultRow`, `ErrorRow`, `BadRow`, `SeriesRow`) whose fields are the
table's columns in order; its `Table` derives the INSERT and SELECT column lists from it, so a field is named
in one place. A migration that adds a column adds the field in the same change.

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
from functools import cached_property
from pathlib import Path
from typing import IO, Any, Generic, NamedTuple, TypeVar

from fleetgen.errors import JobError, LedgerConflict

DB_NAME = "results.sqlite"
LOCK_NAME = ".fleetgen-run.lock"


class ResultRow(NamedTuple):
    """A `results` row: one (record, sample) answered. The field order is the table's column order."""

    id: str
    sample: int
    khash: int  # key_hash(id, sample): resume reads it (with chash) through a covering index
    source: str
    line: int
    prompt: str  # the segments sent, JSON
    content: str
    reasoning_content: str
    turns: str | None  # every turn, JSON, when there is more than one
    num_turns: int
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    instance: str
    model: str
    params_hash: str
    attempts: int
    started_at: float
    latency_s: float
    finished_at: float
    is_truncated: int
    is_empty: int
    has_leaked_think: int
    is_repetitive: int
    chash: int  # the hash of the prompt it answers (migration 3)
    input_index: int  # which input of the folder the record is from (migration 4)


class ErrorRow(NamedTuple):
    """An `errors` row: a (record, sample) given up on, with the reason."""

    id: str
    sample: int
    khash: int
    source: str
    line: int
    kind: str
    reason: str
    status: int | None
    attempts: int
    instance: str
    finished_at: float
    chash: int
    input_index: int


class BadRow(NamedTuple):
    """An `inputs_bad` row: an input line that cannot become work (its verdict is final, as an answer is)."""

    source: str
    line: int
    record_id: str | None
    reason: str
    finished_at: float
    input_index: int


class SeriesRow(NamedTuple):
    """A `timeseries` row: one instance's cumulative counts at time `t`."""

    t: float
    instance: str
    completions: int
    output_tokens: int
    in_flight: int
    accept_length: float | None


R = TypeVar("R", ResultRow, ErrorRow, BadRow, SeriesRow)


@dataclass(frozen=True)
class Table(Generic[R]):
    """A table and the record of its rows: its INSERT and SELECT column lists come from the record."""

    name: str
    record: type[R]

    @property
    def columns(self) -> str:
        return ", ".join(self.record._fields)

    @cached_property
    def insert(self) -> str:
        """A plain INSERT: what a row's key already holds is decided before it (`Store.write_batch`)."""
        marks = ", ".join("?" * len(self.record._fields))
        return f"INSERT INTO {self.name} ({self.columns}) VALUES ({marks})"


RESULTS = Table("results", ResultRow)
ERRORS = Table("errors", ErrorRow)
BAD = Table("inputs_bad", BadRow)
SERIES = Table("timeseries", SeriesRow)
TABLES: tuple[Table[Any], ...] = (RESULTS, ERRORS, BAD, SERIES)
TABLE_INDEX = {table.record: index for index, table in enumerate(TABLES)}  # record type → its table


MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema.
    """
    CREATE TABLE results (
        id TEXT NOT NULL, sample INTEGER NOT NULL, khash INTEGER NOT NULL, source TEXT, line INTEGER,
        prompt TEXT, content TEXT, reasoning_content TEXT, turns TEXT, num_turns INTEGER,
        finish_reason TEXT, prompt_tokens INTEGER, completion_tokens INTEGER, instance TEXT, model TEXT,
        params_hash TEXT, attempts INTEGER, started_at REAL, latency_s REAL, finished_at REAL,
        is_truncated INTEGER, is_empty INTEGER, has_leaked_think INTEGER, is_repetitive INTEGER,
        UNIQUE (id, sample)
    );
    CREATE INDEX results_resume ON results (line, khash);
    CREATE TABLE errors (
        id TEXT NOT NULL, sample INTEGER NOT NULL, khash INTEGER NOT NULL, source TEXT, line INTEGER,
        kind TEXT, reason TEXT, status INTEGER, attempts INTEGER, instance TEXT, finished_at REAL,
        PRIMARY KEY (id, sample)
    );
    CREATE INDEX errors_resume ON errors (line, khash);
    CREATE TABLE inputs_bad (
        source TEXT NOT NULL, line INTEGER NOT NULL, record_id TEXT, reason TEXT, finished_at REAL,
        PRIMARY KEY (source, line)
    );
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
    CREATE TABLE timeseries (
        t REAL, instance TEXT, completions INTEGER, output_tokens INTEGER, in_flight INTEGER,
        accept_length REAL
    );
    """,
    # 2: counting truncated rows (progress, resume summary, --redo-truncated) must not scan every row's text.
    """
    CREATE INDEX results_truncated ON results (is_truncated, khash) WHERE is_truncated = 1;
    """,
    # 3: each row keeps the hash of the prompt it answers (`chash`): a rerun refuses a record whose id is
    # stored with other content instead of skipping it. Resume reads it through the covering indexes.
    """
    ALTER TABLE results ADD COLUMN chash INTEGER;
    ALTER TABLE errors ADD COLUMN chash INTEGER;
    DROP INDEX results_resume;
    DROP INDEX errors_resume;
    CREATE INDEX results_resume ON results (line, khash, chash);
    CREATE INDEX errors_resume ON errors (line, khash, chash);
    """,
    # 4: rows say which input of the folder they come from (0, then one more per --add-input), so a line means
    # one record whatever the file is called now; a bad line is keyed by (input, line). Rows written before
    # are the first input's.
    """
    ALTER TABLE results ADD COLUMN input_index INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE errors ADD COLUMN input_index INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE inputs_bad_4 (
        source TEXT NOT NULL, line INTEGER NOT NULL, record_id TEXT, reason TEXT, finished_at REAL,
        input_index INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (input_index, line)
    );
    INSERT OR IGNORE INTO inputs_bad_4 SELECT source, line, record_id, reason, finished_at, 0 FROM inputs_bad;
    DROP TABLE inputs_bad;
    ALTER TABLE inputs_bad_4 RENAME TO inputs_bad;
    """,
)


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
        """Where the rows of `record_id` were read (its first line, any input), on a reader connection of its
        own: the writer's transactions never block it (WAL)."""
        if self._reader is None:
            self._reader = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        row = self._reader.execute(
            "SELECT input_index, line, IFNULL(chash, 0) FROM results WHERE id = ?1 UNION ALL "
            "SELECT input_index, line, IFNULL(chash, 0) FROM errors WHERE id = ?1 ORDER BY 1, 2 LIMIT 1",
            (record_id,),
        ).fetchone()
        return None if row is None else Stored(*row)

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


def migrate(conn: sqlite3.Connection) -> None:
    """Apply the migrations not yet applied, each in its own transaction."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise JobError(
            f"the store has schema version {version}; this fleetgen knows {len(MIGRATIONS)}",
            fix="upgrade fleetgen to read this output folder",
        )
    for number in range(version, len(MIGRATIONS)):  # executescript commits first: each one is atomic
        conn.executescript(f"BEGIN; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;")


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
