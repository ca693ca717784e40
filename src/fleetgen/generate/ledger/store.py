"""The durable store of a job: one SQLite file (WAL) in the output folder.

Tables: `results` (one row per (record id, sample), upserted, with the hash of the prompt it answers),
`errors` (same key, with the reason), `inputs_bad` (file, line, reason), `meta` (sampling params, the input's
identity, resume position), `timeseries` (per instance every few seconds, for reports). Schema changes are an
append-only list of migrations (`PRAGMA user_version` counts those applied).

A row of a table is a named record (`ResultRow`, `ErrorRow`, `BadRow`, `SeriesRow`) whose fields are the
table's columns in order; its `Table` derives the INSERT (an upsert on the key) and SELECT column lists from
it, so a field is named in one place. A migration that adds a column adds the field in the same change.

Writes come in batches from one writer (`StoreWriter`, which says how often), one transaction each, then
`on_commit` — so whatever the progress counts is already on disk, and a kill -9 leaves either a whole row or
none. Resume reads only the compact `khash` column through a covering index.
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

from fleetgen.errors import JobError

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


class BadRow(NamedTuple):
    """An `inputs_bad` row: an input line that cannot become work."""

    source: str
    line: int
    record_id: str | None
    reason: str
    finished_at: float


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
    key: tuple[str, ...] = ()  # the conflict key of an upsert; none: a plain insert

    @property
    def columns(self) -> str:
        return ", ".join(self.record._fields)

    @cached_property
    def insert(self) -> str:
        marks = ", ".join("?" * len(self.record._fields))
        sql = f"INSERT INTO {self.name} ({self.columns}) VALUES ({marks})"
        if not self.key:
            return sql
        updates = ", ".join(f"{c} = excluded.{c}" for c in self.record._fields if c not in self.key)
        return f"{sql} ON CONFLICT ({', '.join(self.key)}) DO UPDATE SET {updates}"


RESULTS = Table("results", ResultRow, key=("id", "sample"))
ERRORS = Table("errors", ErrorRow, key=("id", "sample"))
BAD = Table("inputs_bad", BadRow, key=("source", "line"))
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


@dataclass
class Store:
    """The SQLite store of one output folder. Open with `Store.open`; one writer at a time (a lock file)."""

    conn: sqlite3.Connection
    path: Path
    _lock: IO[bytes] | None

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
            raise JobError(
                f"cannot open the store {path}: {exc}",
                fix="check the folder is writable and the disk not full",
            ) from exc
        return cls(conn, path, lock)

    def close(self) -> None:
        self.conn.close()
        if self._lock is not None:
            self._lock.close()

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, items: dict[str, str]) -> None:
        self.conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", items.items())

    def delete_meta(self, *keys: str) -> None:
        self.conn.executemany("DELETE FROM meta WHERE key = ?", ((key,) for key in keys))

    def bad_lines(self, source: str) -> set[int]:
        """Lines of `source` recorded as bad input (by earlier runs)."""
        return {
            line for (line,) in self.conn.execute("SELECT line FROM inputs_bad WHERE source = ?", (source,))
        }

    def done_keys(self, after_line: int = 0) -> dict[int, int]:
        """Key (`khash`) → content hash (`chash`, 0 when unknown) of every result and error row past
        `after_line`, read through covering indexes."""
        keys: dict[int, int] = {}
        for table in ("results", "errors"):
            cursor = self.conn.execute(
                f"SELECT khash, IFNULL(chash, 0) FROM {table} WHERE line > ?", (after_line,)
            )
            keys.update(cursor)  # (key, hash) pairs straight into the dict, at C speed
        return keys

    def keys_where(self, table: str, where: str = "1") -> set[int]:
        """Keys of the rows of `table` matching `where` (e.g. the error rows, or the truncated results)."""
        return {k for (k,) in self.conn.execute(f"SELECT khash FROM {table} WHERE {where}")}

    def counts(self) -> Counts:
        tables = ("results", "errors", "results WHERE is_truncated = 1", "inputs_bad")  # Counts' order
        counts = ", ".join(f"(SELECT COUNT(*) FROM {table})" for table in tables)
        return Counts._make(self.conn.execute(f"SELECT {counts}").fetchone())

    def write_batch(self, batch: Batch) -> None:
        """Write a batch in one transaction: all of it or none of it."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            # A success replaces an earlier error row for the same key (--retry-errors).
            keys = ((row.id, row.sample) for row in batch.results)
            conn.executemany("DELETE FROM errors WHERE id = ? AND sample = ?", keys)
            for table, rows in zip(TABLES, batch.rows(), strict=True):
                conn.executemany(table.insert, rows)
            self.set_meta(batch.meta)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise JobError(
                f"writing results to {self.path} failed: {exc}",
                fix="check free disk space and that nothing else writes this folder; "
                "rerun the same command to resume (nothing committed is lost)",
            ) from exc

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
    for number in range(version, len(MIGRATIONS)):
        conn.executescript(f"BEGIN; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;")


def _take_lock(out_dir: Path) -> IO[bytes]:
    out_dir.mkdir(parents=True, exist_ok=True)
    handle = (out_dir / LOCK_NAME).open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        raise JobError(
            f"another `fleetgen run` is writing {out_dir}",
            fix="wait for it to finish or stop it; two runs on one folder would do work twice",
        ) from exc
    return handle
