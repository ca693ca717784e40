"""What a run reads: its input checked against the output folder, the resume plan, records → work items.

- `Intake.open`: refuse another input than the folder's (`identity.check`), record the input's identity;
  a folder with no result or error row holds no job yet (e.g. after a fail-fast stop) and takes any input;
- `plan`: where reading starts (a trusted resume position, `identity.ResumeCheck`), the verdicts of earlier
  runs (bad lines), which keys are done, or (the re-run modes) which keys are redone;
- `work`: each record is judged (`_judge`) over the whole input, whatever the resume point: the first valid
  record of an id owns it and its (record, sample)s not done become `Work`; every later valid record with
  that id is a bad-input row, "duplicate id 'X': first at line N, with the same prompt / another prompt"; a
  record that is bad input owns no id; a line judged bad by an earlier run keeps its verdict (not re-judged).
  A record whose rows are stored at its own line with other content, or at a later line, means the input
  changed: `InputMismatch`. An id stored from an earlier input of the folder (`--add-input`) with the same
  prompt is done; with another prompt it is a bad-input row. The first `diagnose.FAIL_FAST` records of a job
  with no result all bad (or a whole short input) are an `InputError` naming the likely cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import orjson

from fleetgen.errors import InputError
from fleetgen.generate import diagnose, rows
from fleetgen.generate.ledger import identity, jobmeta
from fleetgen.generate.ledger.store import Store, Stored
from fleetgen.generate.ledger.writer import StoreWriter
from fleetgen.generate.progress import Counters, PositionTracker
from fleetgen.generate.source import IsDone, Position, conflict, read_records
from fleetgen.generate.work import BadInput, JobOptions, Record, RunMode, Work, id_key, key_hash

# The re-run modes: the table and condition of the keys each one redoes.
REDO: dict[RunMode, tuple[str, str]] = {
    "retry_errors": ("errors", "1"),
    "redo_truncated": ("results", "is_truncated = 1"),
}


class Claims:
    """The ids owned by records read this run: id key → (line, prompt hash), packed in one int per id (a job
    of millions of records holds one entry per id read)."""

    def __init__(self) -> None:
        self._packed: dict[int, int] = {}

    def get(self, key: int) -> Stored | None:
        packed = self._packed.get(key)
        if packed is None:
            return None
        chash = packed & _MASK
        return Stored(0, packed >> 64, chash - (1 << 64) if chash >> 63 else chash)

    def add(self, key: int, line: int, chash: int) -> None:
        self._packed[key] = line << 64 | chash & _MASK


_MASK = (1 << 64) - 1


@dataclass
class Intake:
    """The input side of one run: `open`, `plan`, `work` (the module docstring says what each does)."""

    options: JobOptions
    resume: identity.ResumeCheck
    had_results: bool  # the store held results when the run started
    input_index: int  # which input of the folder this run reads (0, then one more per --add-input)
    # The plan (`plan`): the resume position's tracker (normal runs), the keys a re-run mode redoes, the done
    # keys past the position → where they were read, the lines earlier runs judged bad, and where the rows
    # of an id not among `done` were read (the store; None when every stored row is in `done`).
    tracker: PositionTracker | None = None
    wanted: set[int] | None = None
    done: dict[int, Stored] = field(default_factory=dict)
    verdicts: set[int] = field(default_factory=set)
    stored_at: Callable[[str], Stored | None] | None = None
    claims: Claims = field(default_factory=Claims)
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
        return cls(opts, resume, had_results=counts.results > 0, input_index=jobmeta.input_index(store))

    def plan(self, store: Store, counters: Counters) -> None:
        counters.before = before = store.counts()
        self.verdicts = store.bad_lines(self.input_index)
        if self.options.mode in REDO:
            self.wanted = store.keys_where(*REDO[self.options.mode])
        else:
            start = Position()
            saved = store.get_meta(jobmeta.POSITION)
            if saved is not None:
                data = orjson.loads(saved)
                if self.resume.trusts(data):
                    start = Position(int(data["line"]), int(data["offset"]))
            self.tracker = PositionTracker(start)
            self.done = store.done_keys(self.input_index, start.line)
        if before.results + before.errors > len(self.done):  # rows before the position, or other inputs'
            self.stored_at = store.stored_at

    def done_check(self) -> IsDone | None:
        """Normal runs: a record whose every sample is done at its own line is skipped once its content is
        checked against the stored hash (the source refuses it with other content)."""
        done = self.done
        if self.wanted is not None or not done:
            return None
        samples = range(self.options.params.samples)

        def is_done(record_id: str, line: int) -> int | None:
            stored = [done.get(key_hash(record_id, s)) for s in samples]
            first = stored[0]
            if first is None or first.line != line or None in stored:
                return None
            return first.chash

        return is_done

    def work(self, writer: StoreWriter) -> Iterator[Work]:
        opts, tracker, wanted = self.options, self.tracker, self.wanted
        start = tracker.position if tracker else Position()
        for record in read_records(opts.input_path, opts.shape, start, opts.split, self.done_check()):
            if isinstance(record, Position):
                if tracker is not None:
                    tracker.open(record.line, record.offset, 0)
                continue
            if record.line in self.verdicts:  # judged bad by an earlier run: its verdict stands
                if tracker is not None:
                    tracker.open(record.line, record.end_offset, 0)
                continue
            todo = self._judge(record) if isinstance(record, Record) else record
            if isinstance(todo, BadInput):
                if wanted is None:  # re-run modes write only the rows they redo
                    if tracker is not None:
                        tracker.open(todo.line, todo.end_offset, 1)
                    writer.put(rows.bad_row(todo, self.input_index))
                    self._note_bad(todo)
                continue
            assert isinstance(record, Record)
            self.num_good += 1
            if tracker is not None:
                tracker.open(record.line, record.end_offset, len(todo))
            for sample in todo:
                yield Work(record, sample)
        if self.first_bad and not self.num_good:  # `_note_bad` notes them only in a job with no results
            raise self._all_bad()  # a short input, every record bad

    def _judge(self, record: Record) -> list[int] | BadInput:
        """The samples of `record` to send now, or why it is bad input (the module docstring's rules)."""
        key = id_key(record.record_id)
        owner = self.claims.get(key)
        if owner is not None:
            return _duplicate(record, owner)
        stored = self._stored(record)
        if stored is not None and stored.input_index != self.input_index:  # an earlier input's record
            if stored.chash in (0, record.content_hash):
                return []
            reason = (
                f"id {record.record_id!r} is stored from an earlier input of this folder with another prompt"
            )
            return BadInput(record.source, record.line, reason, record.record_id, record.end_offset)
        if stored is not None and stored.line < record.line:
            return _duplicate(record, stored)
        if stored is not None and (stored.line > record.line or stored.chash not in (0, record.content_hash)):
            raise conflict(record.record_id, record.source, record.line)
        self.claims.add(key, record.line, record.content_hash)
        keys = [key_hash(record.record_id, s) for s in range(self.options.params.samples)]
        if self.wanted is not None:
            return [s for s, k in enumerate(keys) if k in self.wanted]
        return [s for s, k in enumerate(keys) if k not in self.done]

    def _stored(self, record: Record) -> Stored | None:
        """Where the rows of `record`'s id were read, if any are stored."""
        stored = self.done.get(key_hash(record.record_id, 0))
        for sample in range(1, self.options.params.samples):
            stored = stored or self.done.get(key_hash(record.record_id, sample))
        if stored is None and self.stored_at is not None:
            stored = self.stored_at(record.record_id)
        return stored

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


def _duplicate(record: Record, first: Stored) -> BadInput:
    """A later record with an owned id: bad input, naming the owner's line and whether the prompts agree."""
    reason = f"duplicate id {record.record_id!r}: first at line {first.line}"
    if first.chash:
        reason += ", with the same prompt" if first.chash == record.content_hash else ", with another prompt"
    return BadInput(record.source, record.line, reason, record.record_id, record.end_offset)
