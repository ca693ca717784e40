"""The meta rows a job keeps current for its readers: the next run, the dashboard and the report.

- `input_identity`: what ties the folder to its input (`identity.py`), refreshed by each run;
  `earlier_inputs`: the identities of inputs this folder held before an `--add-input` run;
- `position`: where a rerun may start reading (see `PositionTracker`), with its check (`ResumeCheck`);
- `total`: the number of work items, (records − bad lines) × samples, a JSON int. Known once the input is
  counted (a background count: JSONL lines at C speed; Parquet / datasets from their metadata), kept up to
  date as bad lines turn up, and made exact (results + errors) when the job completes;
- `finished_at`: unix time the job completed; absent while a run is going on;
- `fleet`, `engine_args`: what generated the data (see `fleetlink`), written when a run starts.

Values are JSON (the dashboard decodes each one), written by the one writer with the rows they describe.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fleetgen.generate.ledger import identity
from fleetgen.generate.ledger.store import BadRow, Batch, ErrorRow, ResultRow, Store
from fleetgen.generate.progress import PositionTracker

TOTAL = "total"
FINISHED_AT = "finished_at"
POSITION = "position"
INPUT_IDENTITY = "input_identity"
EARLIER_INPUTS = "earlier_inputs"


@dataclass
class JobMeta:
    """The live meta of one run. `current()` is what the writer stores with each batch."""

    resume: identity.ResumeCheck
    samples: int
    tracker: PositionTracker | None  # None in the re-run modes
    bad_lines: set[int]  # input lines recorded as bad: not work items, the total leaves them out
    num_records: int | None = None  # set by the background count

    @property
    def total(self) -> int | None:
        """Work items of the whole input; None until counted, and in the re-run modes (they change none)."""
        if self.tracker is None or self.num_records is None:
            return None
        return max(self.num_records - len(self.bad_lines), 0) * self.samples

    def committed(self, batch: Batch) -> None:
        """A batch is on disk: its bad lines leave the total, its rows pay their lines' debts (the position
        moves past every line whose rows are all committed)."""
        self.bad_lines.update(bad.line for bad in batch.bad)
        if self.tracker is not None:
            rows: list[ResultRow | ErrorRow | BadRow] = [*batch.results, *batch.errors, *batch.bad]
            for row in rows:
                self.tracker.paid(row.line)
            self.tracker.advance()

    def current(self) -> dict[str, str]:
        items: dict[str, str] = {}
        if self.tracker is not None:
            position = self.tracker.position
            items[POSITION] = _json(self.resume.value(position.line, position.offset))
        total = self.total
        if total is not None:
            items[TOTAL] = _json(total)
        return items


def begin(store: Store, describe: Mapping[str, Any]) -> bool:
    """At the start of a run: record what generates the data; the job is not finished while it runs.

    Returns whether the job had finished before this run (a re-run pass over a finished job finishes it
    again; one over an unfinished job does not).
    """
    was_finished = store.get_meta(FINISHED_AT) is not None
    store.delete_meta(FINISHED_AT)
    if describe:
        store.set_meta({key: _json(value) for key, value in describe.items()})
    return was_finished


def add_input(store: Store, stored_identity: str) -> None:
    """`--add-input`: keep the folder's earlier input identity; its resume position does not apply."""
    earlier = orjson.loads(store.get_meta(EARLIER_INPUTS) or "[]")
    earlier.append(orjson.loads(stored_identity))
    store.set_meta({EARLIER_INPUTS: _json(earlier)})
    store.delete_meta(POSITION)


def input_index(store: Store) -> int:
    """Which input of the folder a run reads: 0, then one more per `--add-input` (rows carry it)."""
    return len(orjson.loads(store.get_meta(EARLIER_INPUTS) or "[]"))


def forget(store: Store) -> None:
    """A folder with no result or error row holds no job yet: forget its input, params, position and bad
    lines, so a run stopped by bad input can start again with a fixed job file or input."""
    store.delete_meta(INPUT_IDENTITY, EARLIER_INPUTS, POSITION, TOTAL, "params")
    store.forget_bad_lines()


def finish(store: Store) -> None:
    """The job is complete: its exact total (every work item is a result or an error row) and the time."""
    counts = store.counts()
    store.set_meta({TOTAL: _json(counts.results + counts.errors), FINISHED_AT: _json(time.time())})


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()
