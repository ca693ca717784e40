"""The tables of a job's store, one place: each row a named record (`ResultRow`, `ErrorRow`, `BadRow`,
`SeriesRow`) whose fields are its table's columns in order, its `Table` (the INSERT and SELECT column lists
derive from the record, so a field is named once), and the schema as an append-only list of migrations
(`PRAGMA user_version` counts those applied). A migration that adds a column adds the field in the same
change.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, NamedTuple, TypeVar

from fleetgen.errors import JobError


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
    # The last turn's prompt and answer as the engine's token ids (`tokenids.pack`: zstd of uint32s), where
    # the engine returned them (`return_token_ids`); None otherwise (migration 5)
    token_ids: bytes | None = None


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
    # 5: the exact tokens of the last turn (its prompt as the engine tokenized it, the answer's generated
    # ids), so a token export trains on what the target produced, not on its text tokenized again. Rows
    # written before have none: the export tokenizes their text and checks it decodes back.
    """
    ALTER TABLE results ADD COLUMN token_ids BLOB;
    """,
)


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
