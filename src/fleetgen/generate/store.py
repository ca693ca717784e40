"""The durable store of a job: one SQLite file (WAL) in the output folder.

Tables: `results` (one row per (record id, sample), upserted, with the hash of the prompt it answers),
`errors` (same key, with the reason), `inputs_bad` (file, line, reason), `meta` (sampling params, the input's
identity, resume position), `timeseries` (per instance
every few seconds, for reports). Schema changes are an append-only list of migrations (`PRAGMA
user_version` counts those applied).

Writes come in batches from one writer (`StoreWriter`): every ~100 ms or 512 rows, one transaction, then
`on_commit` — so whatever the progress counts is already on disk, and a kill -9 leaves either a whole row or
none. Resume reads only the compact `khash` column through a covering index.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleetgen.errors import JobError

DB_NAME = "results.sqlite"
LOCK_NAME = ".fleetgen-run.lock"

RESULT_COLUMNS = (
    "id", "sample", "khash", "source", "line", "prompt", "content", "reasoning_content", "turns", "num_turns",
    "finish_reason", "prompt_tokens", "completion_tokens", "instance", "model", "params_hash", "attempts",
    "started_at", "latency_s", "finished_at", "is_truncated", "is_empty", "has_leaked_think", "is_repetitive",
    "chash",
)  # fmt: skip
ERROR_COLUMNS = (
    "id", "sample", "khash", "source", "line", "kind", "reason", "status", "attempts", "instance",
    "finished_at", "chash",
)  # fmt: skip
BAD_COLUMNS = ("source", "line", "record_id", "reason", "finished_at")
SERIES_COLUMNS = ("t", "instance", "completions", "output_tokens", "in_flight", "accept_length")

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


def _upsert(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    marks = ", ".join("?" * len(columns))
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )


UPSERT_RESULT = _upsert("results", RESULT_COLUMNS, ("id", "sample"))
UPSERT_ERROR = _upsert("errors", ERROR_COLUMNS, ("id", "sample"))
UPSERT_BAD = _upsert("inputs_bad", BAD_COLUMNS, ("source", "line"))
INSERT_SERIES = f"INSERT INTO timeseries ({', '.join(SERIES_COLUMNS)}) VALUES ({', '.join('?' * 6)})"


@dataclass
class Batch:
    """Rows written in one transaction. `lines` maps each row to its input line (for the resume position)."""

    results: list[tuple[Any, ...]] = field(default_factory=list)
    errors: list[tuple[Any, ...]] = field(default_factory=list)
    bad: list[tuple[Any, ...]] = field(default_factory=list)
    series: list[tuple[Any, ...]] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.results) + len(self.errors) + len(self.bad) + len(self.series)


@dataclass(frozen=True)
class Counts:
    """What the store holds."""

    results: int
    errors: int
    truncated: int
    bad_inputs: int


class Store:
    """The SQLite store of one output folder. Open with `Store.open`; one writer at a time (a lock file)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, lock: IO[bytes] | None) -> None:
        self.conn = conn
        self.path = path
        self._lock = lock

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

    def delete_meta(self, key: str) -> None:
        self.conn.execute("DELETE FROM meta WHERE key = ?", (key,))

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
        one = self.conn.execute
        return Counts(
            results=one("SELECT COUNT(*) FROM results").fetchone()[0],
            errors=one("SELECT COUNT(*) FROM errors").fetchone()[0],
            truncated=one("SELECT COUNT(*) FROM results WHERE is_truncated = 1").fetchone()[0],
            bad_inputs=one("SELECT COUNT(*) FROM inputs_bad").fetchone()[0],
        )

    def write_batch(self, batch: Batch) -> None:
        """Write a batch in one transaction: all of it or none of it."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            if batch.results:
                conn.executemany(UPSERT_RESULT, batch.results)
                # A success replaces an earlier error row for the same key (--retry-errors).
                conn.executemany(
                    "DELETE FROM errors WHERE id = ? AND sample = ?",
                    ((row[0], row[1]) for row in batch.results),
                )
            if batch.errors:
                conn.executemany(UPSERT_ERROR, batch.errors)
            if batch.bad:
                conn.executemany(UPSERT_BAD, batch.bad)
            if batch.series:
                conn.executemany(INSERT_SERIES, batch.series)
            if batch.meta:
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

    def iter_rows(self, sql: str, params: Iterable[Any] = (), chunk: int = 1000) -> Iterable[sqlite3.Row]:
        """Stream rows of a query, `chunk` at a time (exports never hold a whole table)."""
        cursor = self.conn.cursor()
        cursor.row_factory = sqlite3.Row
        cursor.execute(sql, tuple(params))
        while rows := cursor.fetchmany(chunk):
            yield from rows


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations not yet applied, each in its own transaction; return the schema version."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise JobError(
            f"the store has schema version {version}; this fleetgen knows {len(MIGRATIONS)}",
            fix="upgrade fleetgen to read this output folder",
        )
    for number in range(version, len(MIGRATIONS)):
        conn.executescript(f"BEGIN; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;")
    return len(MIGRATIONS)


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


def now() -> float:
    """Wall-clock seconds, for row timestamps."""
    return time.time()
