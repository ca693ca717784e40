"""Read a job's store (`OUT_DIR/results.sqlite`) read-only, incrementally, into a `JobView`.

The store's writer is a running `fleetgen run`: this reader opens the file with a `mode=ro` URI so it can
never take a write lock or change a byte, and re-reads only rows it has not seen (by rowid), so polling a
job of millions of rows every 1.5 s costs the new rows, not the table. SQL stays here: the store's Python
API is for the one writer.
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from pathlib import Path
from typing import Any

from fleetgen.dashboard.model import Example, JobView, Sample
from fleetgen.errors import JobError
from fleetgen.generate.ledger import jobmeta
from fleetgen.generate.ledger.store import DB_NAME, SERIES, SeriesRow

NUM_EXAMPLES = 5
QUALITY_COLUMNS = {
    "is_truncated": "truncated",
    "is_empty": "empty answer",
    "has_leaked_think": "leaked <think>",
    "is_repetitive": "repetitive",
}


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection (URI `mode=ro`): never a writer, never a lock a running job could wait on."""
    if not path.is_file():
        raise JobError(
            f"{path.parent} holds no job store ({DB_NAME} missing)",
            fix="pass the folder given to `fleetgen run -o` (it appears when the run starts)",
        )
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 2000")
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise JobError(
            f"cannot read the job store {path}: {exc}",
            fix="check the file is readable; a store from a newer fleetgen needs that version",
        ) from exc
    return conn


class JobReader:
    """Polls one job store; keeps the time series and output lengths it has read (by rowid)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.path = out_dir / DB_NAME
        self._conn: sqlite3.Connection | None = None
        self._series_rowid = 0
        self._result_rowid = 0
        self._samples: list[Sample] = []
        self._offsets: dict[str, tuple[int, int, int, int]] = {}  # instance → (last c, last t, add c, add t)
        self._reasoning = array("l")
        self._answer = array("l")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def read(self, *, num_errors: int = NUM_EXAMPLES) -> JobView:
        """The job as it is now; raises JobError when the store cannot be read."""
        if self._conn is None:
            self._conn = connect_ro(self.path)
        try:
            return self._read(self._conn, num_errors)
        except sqlite3.Error as exc:
            self.close()
            raise JobError(
                f"reading the job store {self.path} failed: {exc}",
                fix="check the file is readable and the disk healthy; the run itself is unaffected",
            ) from exc

    def _read(self, conn: sqlite3.Connection, num_errors: int) -> JobView:
        conn.execute("BEGIN")  # one snapshot: counts, examples and series agree with each other
        try:
            meta = _meta(conn)
            done, truncated = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(is_truncated), 0) FROM results"
            ).fetchone()
            errors = conn.execute("SELECT COUNT(*) FROM errors").fetchone()[0]
            self._read_new_series(conn)
            self._read_new_lengths(conn)
            first, last = conn.execute("SELECT MIN(started_at), MAX(finished_at) FROM results").fetchone()
            edges = [s.ts for s in self._samples[:1] + self._samples[-1:]]  # the series' first and last
            view = JobView(
                out_dir=str(self.out_dir),
                total=_total(meta),
                done=done,
                num_errors=errors,
                num_truncated=truncated,
                error_examples=_errors(conn, num_errors),
                truncation_examples=_truncations(conn, NUM_EXAMPLES),
                error_kinds=_group(conn, "errors", "kind"),
                finish_reasons=_group(conn, "results", "finish_reason"),
                quality_flags=_quality(conn),
                reasoning_tokens=tuple(self._reasoning),
                answer_tokens=tuple(self._answer),
                samples=tuple(self._samples),
                meta=meta,
                started_at=min((t for t in (first, *edges) if t is not None), default=None),
                updated_at=max((t for t in (last, *edges) if t is not None), default=None),
                is_finished=bool(meta.get("finished_at")),
            )
        finally:
            conn.execute("COMMIT")
        return view

    def _read_new_series(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute(
            f"SELECT rowid, {SERIES.columns} FROM {SERIES.name} WHERE rowid > ? ORDER BY rowid",
            (self._series_rowid,),
        ).fetchall()
        for rowid, *values in rows:
            self._series_rowid = rowid
            row = SeriesRow._make(values)
            completions, tokens = self._monotone(
                row.instance, int(row.completions or 0), int(row.output_tokens or 0)
            )
            self._samples.append(
                Sample(float(row.t), str(row.instance), completions, tokens, row.accept_length)
            )
        self._samples.sort(key=lambda s: s.ts)

    def _monotone(self, instance: str, completions: int, tokens: int) -> tuple[int, int]:
        """Counters restart at 0 when a run is resumed: carry the earlier run's count forward."""
        last_c, last_t, add_c, add_t = self._offsets.get(instance, (0, 0, 0, 0))
        if completions < last_c or tokens < last_t:
            add_c, add_t = add_c + last_c, add_t + last_t
        self._offsets[instance] = (completions, tokens, add_c, add_t)
        return completions + add_c, tokens + add_t

    def _read_new_lengths(self, conn: sqlite3.Connection) -> None:
        # Engines report one completion_tokens; the reasoning share is estimated from the characters.
        rows = conn.execute(
            "SELECT rowid, COALESCE(completion_tokens, 0), COALESCE(length(reasoning_content), 0), "
            "COALESCE(length(content), 0) FROM results WHERE rowid > ? ORDER BY rowid",
            (self._result_rowid,),
        ).fetchall()
        for rowid, tokens, reasoning_chars, answer_chars in rows:
            self._result_rowid = rowid
            chars = reasoning_chars + answer_chars
            reasoning = round(tokens * reasoning_chars / chars) if chars else 0
            self._reasoning.append(reasoning)
            self._answer.append(tokens - reasoning)


def _meta(conn: sqlite3.Connection) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, value in conn.execute("SELECT key, value FROM meta ORDER BY key"):
        try:
            meta[key] = json.loads(value)
        except (TypeError, ValueError):
            meta[key] = value
    return meta


def _total(meta: dict[str, Any]) -> int | None:
    value = meta.get(jobmeta.TOTAL)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _group(conn: sqlite3.Connection, table: str, column: str) -> dict[str, int]:
    sql = f"SELECT COALESCE({column}, '(none)'), COUNT(*) FROM {table} GROUP BY 1"
    return {str(key): int(count) for key, count in conn.execute(sql)}


def _quality(conn: sqlite3.Connection) -> dict[str, int]:
    sums = ", ".join(f"COALESCE(SUM({column}), 0)" for column in QUALITY_COLUMNS)
    row = conn.execute(f"SELECT {sums} FROM results").fetchone()
    return {label: int(value) for label, value in zip(QUALITY_COLUMNS.values(), row, strict=True)}


def _errors(conn: sqlite3.Connection, limit: int) -> tuple[Example, ...]:
    rows = conn.execute(
        "SELECT id || '#' || sample, COALESCE(instance, ''), COALESCE(kind, ''), COALESCE(reason, ''), "
        "status, attempts FROM errors ORDER BY finished_at DESC LIMIT ?",
        (limit,),
    )
    return tuple(
        Example(record, inst, f"{reason}{f' (HTTP {status})' if status else ''} after {n} attempts", kind)
        for record, inst, kind, reason, status, n in rows
    )


def _truncations(conn: sqlite3.Connection, limit: int) -> tuple[Example, ...]:
    rows = conn.execute(
        "SELECT id || '#' || sample, COALESCE(instance, ''), completion_tokens, "
        "substr(COALESCE(content, ''), -100), substr(COALESCE(reasoning_content, ''), -100) FROM results "
        "WHERE is_truncated = 1 ORDER BY finished_at DESC LIMIT ?",
        (limit,),
    )
    return tuple(
        Example(record, inst, f"{tokens} tokens, ends: …{content or reasoning!r}", "length")
        for record, inst, tokens, content, reasoning in rows
    )
