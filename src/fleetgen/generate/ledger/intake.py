"""What a run reads: its input checked against the output folder, the resume plan, records → work items.

- `Intake.open`: refuse another input than the folder's (`identity.check`), record the input's identity;
  a folder with no result or error row holds no job yet (e.g. after a fail-fast stop) and takes any input;
- `plan`: where reading starts (a trusted resume position, `identity.ResumeCheck`) and which keys are done,
  or (the re-run modes) which keys are redone;
- `work`: each (record, sample) not done becomes a `Work`; a bad record an `inputs_bad` row; a stored id
  with other content an `InputMismatch`; the first `diagnose.FAIL_FAST` records of a job with no result all
  bad (or a whole short input) an `InputError` naming the likely cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from fleetgen.errors import InputError
from fleetgen.generate import diagnose, rows
from fleetgen.generate.ledger import identity, jobmeta
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.ledger.writer import StoreWriter
from fleetgen.generate.progress import Counters, PositionTracker
from fleetgen.generate.source import IsDone, Position, conflict, read_records
from fleetgen.generate.work import BadInput, JobOptions, Record, RunMode, Work, key_hash

# The re-run modes: the table and condition of the keys each one redoes.
REDO: dict[RunMode, tuple[str, str]] = {
    "retry_errors": ("errors", "1"),
    "redo_truncated": ("results", "is_truncated = 1"),
}


@dataclass
class Intake:
    """The input side of one run: `open`, `plan`, `work` (the module docstring says what each does)."""

    options: JobOptions
    resume: identity.ResumeCheck
    had_results: bool  # the store held results when the run started
    # The plan (`plan`): the resume position's tracker (normal runs), the keys a re-run mode redoes, and the
    # done keys past the position → their content hashes.
    tracker: PositionTracker | None = None
    wanted: set[int] | None = None
    done: dict[int, int] = field(default_factory=dict)
    num_good: int = 0  # good records read this run
    first_bad: list[BadInput] = field(default_factory=list)  # while no good one was read: the first ones

    @classmethod
    def open(cls, store: Store, opts: JobOptions) -> Intake:
        counts = store.counts()
        if counts.results == 0 and counts.errors == 0:
            jobmeta.forget(store)  # nothing generated yet: any input and params may start here
        stored = store.get_meta(jobmeta.INPUT_IDENTITY)
        now = identity.check(stored, opts)
        if stored is not None and opts.add_input:
            jobmeta.add_input(store, stored)
        store.set_meta({jobmeta.INPUT_IDENTITY: orjson.dumps(now).decode(), "input": str(opts.input_path)})
        resume = identity.ResumeCheck(opts.input_path, now, opts.split)
        return cls(opts, resume, had_results=counts.results > 0)

    def plan(self, store: Store, counters: Counters) -> None:
        counters.before = store.counts()
        if self.options.mode in REDO:
            self.wanted = store.keys_where(*REDO[self.options.mode])
            return
        start = Position()
        saved = store.get_meta(jobmeta.POSITION)
        if saved is not None:
            data = orjson.loads(saved)
            if self.resume.trusts(data):
                start = Position(int(data["line"]), int(data["offset"]))
        self.tracker, self.done = PositionTracker(start), store.done_keys(start.line)

    def done_check(self) -> IsDone | None:
        """Normal runs: a record whose every sample is done is skipped once its content is checked against
        the stored hash (the source refuses a done id with other content)."""
        done = self.done
        if self.wanted is not None or not done:
            return None
        samples = range(self.options.params.samples)
        if len(samples) == 1:
            return lambda record_id: done.get(key_hash(record_id, 0))

        def is_done(record_id: str) -> int | None:
            keys = [key_hash(record_id, s) for s in samples]
            return done[keys[0]] if all(k in done for k in keys) else None

        return is_done

    def work(self, writer: StoreWriter) -> Iterator[Work]:
        opts, tracker, wanted, done = self.options, self.tracker, self.wanted, self.done
        start = tracker.position if tracker else Position()
        seen: set[int] = set()
        for record in read_records(opts.input_path, opts.shape, start, opts.split, self.done_check()):
            if isinstance(record, Position):
                if tracker is not None:
                    tracker.open(record.line, record.offset, 0)
                continue
            if isinstance(record, Record):
                keys = [key_hash(record.record_id, s) for s in range(opts.params.samples)]
                record = _check_duplicate(record, keys[0], seen, wanted, done)
            if isinstance(record, BadInput):
                if wanted is None:  # re-run modes have already recorded the input's bad lines
                    if tracker is not None:
                        tracker.open(record.line, record.end_offset, 1)
                    writer.put(rows.bad_row(record))
                    self._note_bad(record)
                continue
            self.num_good += 1
            _check_content(record, keys, done)
            todo = [s for s, k in enumerate(keys) if (k in wanted if wanted is not None else k not in done)]
            if tracker is not None:
                tracker.open(record.line, record.end_offset, len(todo))
            for sample in todo:
                yield Work(record, sample, keys[sample])
        if self.first_bad and not self.num_good:  # `_note_bad` notes them only in a job with no results
            raise self._all_bad()  # a short input, every record bad

    def _note_bad(self, record: BadInput) -> None:
        """The first FAIL_FAST records of a job that has no results all bad: stop, naming the likely cause."""
        if self.num_good or self.had_results:
            return
        self.first_bad.append(record)
        if len(self.first_bad) == diagnose.FAIL_FAST:
            raise self._all_bad()

    def _all_bad(self) -> InputError:
        opts = self.options
        return diagnose.all_bad(opts.input_path, opts.shape, opts.split, self.first_bad)


def _check_duplicate(
    record: Record, first_key: int, seen: set[int], wanted: set[int] | None, done: dict[int, int]
) -> Record | BadInput:
    """A second record with an id already seen in this run is bad input (its key would collide).

    Records done in an earlier run are not remembered: their duplicates were reported then, and a million
    done keys need not be held twice.
    """
    if wanted is None and first_key in done:
        return record
    record_key = key_hash(record.record_id, -1)
    if record_key in seen:
        reason = f"duplicate id {record.record_id!r}"
        return BadInput(record.source, record.line, reason, record.record_id, record.end_offset)
    seen.add(record_key)
    return record


def _check_content(record: Record, keys: list[int], done: dict[int, int]) -> None:
    """A sample of this record already stored for another prompt (same id, other content) is an error."""
    for key in keys:
        stored = done.get(key, 0)
        if stored and stored != record.content_hash:
            raise conflict(record.record_id, record.source, record.line)
