"""The chaos test's input and its oracle: a seeded JSONL of ordinary records with hostile lines sprinkled in,
each line generated with what it is meant to be, and the ledger the input alone implies.

The oracle's rules (issue 29): a line that is bad input (bad JSON, not an object, no / empty / wrongly typed
prompt, a broken conversation) claims no id; the first *valid* record of an id owns it — one results-or-errors
row per (id, sample), with that record's line and prompt; every later valid record with that id is an
`inputs_bad` row whose reason says `duplicate id`, the owner's line and whether it carries the same prompt or
another; an owner whose prompt does not fit the servers' context ends as an `errors` row of kind
`prompt_too_long`; blank lines are skipped and leave no row. Ids are `str(value)` (5 and "5" are one id); a
record without one (or with an empty one) takes its content hash (`generate.source.content_id`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetgen.generate.source import content_id
from fleetgen.sim.text import WORDS

Segments = list[list[dict[str, str]]]
SHORT_CHARS = (20, 400)  # an ordinary prompt: fits the servers' context with room for the answer
LONG_CHARS = 3000  # past the servers' context (the test starts them with a small --context-length)


@dataclass(frozen=True)
class Line:
    """One input line and what it is meant to be."""

    text: str  # the line as written (no newline)
    record_id: str | None = None  # the id it claims when valid
    segments: Segments | None = None  # what a valid record sends (None: bad input or blank)
    bad: str | None = None  # bad input: a word its reason must hold
    is_too_long: bool = False

    @property
    def is_valid(self) -> bool:
        return self.segments is not None


@dataclass(frozen=True)
class Expected:
    """The ledger an input implies (`oracle`)."""

    owners: dict[str, int]  # id → its owner's line number
    results: dict[str, int]  # id → owner line: answered (sample 0)
    too_long: dict[str, int]  # id → owner line: an errors row of kind prompt_too_long
    bad: dict[int, list[str]]  # line → words its inputs_bad reason must hold
    segments: dict[str, Segments]  # id → its owner's segments
    blank: set[int] = field(default_factory=set)


def words(rng: random.Random, num_chars: int) -> str:
    text = ""
    while len(text) < num_chars:
        text += rng.choice(WORDS) + " "
    return text.strip()


class Writer:
    """Builds the input line by line (`lines`), remembering the valid records to duplicate later."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.lines: list[Line] = []
        self.valid: list[Line] = []  # valid records written so far (duplicates copy them)
        self.num_ids = 0

    def add(self, line: Line) -> None:
        self.lines.append(line)
        if line.is_valid:
            self.valid.append(line)

    def new_id(self) -> str:
        self.num_ids += 1
        return f"r{self.num_ids}"

    def prompt(self, record_id: Any = None, text: str | None = None, *, too_long: bool = False) -> None:
        """An ordinary `{"id", "prompt"}` record (no id: its content hash)."""
        rng = self.rng
        text = text or words(rng, LONG_CHARS if too_long else rng.randint(*SHORT_CHARS))
        body: dict[str, Any] = {"prompt": text, "meta": rng.randint(0, 9)}
        if record_id is not None:
            body = {"id": record_id, **body}
        rid = str(record_id) if record_id not in (None, "") else content_id(body)
        segments = [[{"role": "user", "content": text}]]
        self.add(Line(json.dumps(body), rid, segments, is_too_long=too_long))

    def conversation(self) -> None:
        """A `messages` record: a system turn and a question, or two questions (two requests, one row)."""
        rng, rid = self.rng, self.new_id()
        system, first, second = (words(rng, rng.randint(10, 80)) for _ in range(3))
        if rng.random() < 0.5:
            turns = [{"role": "system", "content": system}, {"role": "user", "content": first}]
            segments = [turns]
        else:
            turns = [
                {"role": "user", "content": first},
                {"role": "assistant", "content": "an answer the model writes again"},
                {"role": "user", "content": second},
            ]
            segments = [[turns[0]], [turns[2]]]
        self.add(Line(json.dumps({"id": rid, "messages": turns}), rid, segments))

    def duplicate(self, near: bool, same_prompt: bool) -> None:
        """A later record with the id of an earlier valid one (near or far), the same prompt or another."""
        pool = self.valid[-5:] if near else self.valid[: max(1, len(self.valid) - 1000)]
        first = self.rng.choice(pool)
        if same_prompt:
            self.add(Line(first.text, first.record_id, first.segments))
            return
        text = words(self.rng, self.rng.randint(*SHORT_CHARS))
        body = {"id": first.record_id, "prompt": text}
        self.add(Line(json.dumps(body), first.record_id, [[{"role": "user", "content": text}]]))

    def odd_id(self) -> None:
        """Id 5 and id "5" are one id; 0 and False are ids too (only null and "" are not)."""
        value = self.rng.choice([5, "5", 0, False, 7.5, "7.5"])
        self.prompt(value)

    def bad(self) -> None:
        rng = self.rng
        rid = self.new_id() if rng.random() < 0.5 else rng.choice(self.valid).record_id
        choices: list[tuple[str, str]] = [
            (f'{{"id": "{rid}", "prompt": "unterminated', "malformed JSON"),
            ('{"id": "x" "prompt": "no comma"}', "malformed JSON"),
            ("[1, 2, 3]", "expected a JSON object"),
            ('"just a string"', "expected a JSON object"),
            ("null", "expected a JSON object"),
            (json.dumps({"id": rid, "prompt": ""}), "empty or not a string"),
            (json.dumps({"id": rid, "prompt": "   \t "}), "empty or not a string"),
            (json.dumps({"id": rid, "prompt": 42}), "empty or not a string"),
            (json.dumps({"id": rid, "prompt": ["a", "list"]}), "empty or not a string"),
            (json.dumps({"id": rid, "prompt": None}), "empty or not a string"),
            (json.dumps({"id": rid, "text": "no prompt field"}), "missing field"),
            (json.dumps({"id": rid, "messages": []}), "empty messages"),
            (json.dumps({"id": rid, "messages": [{"role": "user", "content": ""}]}), "empty or missing"),
        ]
        text, why = rng.choice(choices)
        self.add(Line(text, bad=why))


def generate_input(seed: int, num_lines: int) -> list[Line]:
    """`num_lines` lines or a few more: mostly ordinary records, hostile ones sprinkled (see the module
    docstring), over-long prompts spread out (never a run of refusals the job would take for its own)."""
    rng = random.Random(seed)
    out = Writer(rng)
    actions: list[tuple[float, Callable[[], None]]] = [
        (0.70, lambda: out.prompt(out.new_id())),
        (0.08, out.conversation),
        (0.02, lambda: out.prompt(None)),  # no id: its content hash
        (0.01, out.odd_id),
        (0.015, lambda: out.prompt(out.new_id(), too_long=True)),
        (0.02, lambda: out.duplicate(near=True, same_prompt=True)),
        (0.02, lambda: out.duplicate(near=True, same_prompt=False)),
        (0.015, lambda: out.duplicate(near=False, same_prompt=True)),
        (0.015, lambda: out.duplicate(near=False, same_prompt=False)),
        (0.07, out.bad),
        (0.025, lambda: out.add(Line(rng.choice(["", "   ", "\t"])))),
    ]
    weights = [w for w, _ in actions]
    out.prompt(out.new_id())
    while len(out.lines) < num_lines:
        rng.choices(actions, weights)[0][1]()
    # A duplicate of a duplicate: an id's third record (after a second one that is already a duplicate).
    first = out.valid[10]
    out.add(Line(first.text, first.record_id, first.segments))
    out.add(Line(first.text, first.record_id, first.segments))
    return out.lines


def oracle(lines: list[Line]) -> Expected:
    """The ledger `lines` imply, from the input alone (the module docstring's rules)."""
    owners: dict[str, int] = {}
    segments: dict[str, Segments] = {}
    bad: dict[int, list[str]] = {}
    blank: set[int] = set()
    for number, line in enumerate(lines, start=1):
        if not line.text.strip():
            blank.add(number)
        elif not line.is_valid:
            assert line.bad is not None
            bad[number] = [line.bad]
        else:
            assert line.record_id is not None and line.segments is not None
            rid = line.record_id
            if rid in owners:
                same = "same prompt" if line.segments == segments[rid] else "another prompt"
                bad[number] = ["duplicate id", f"line {owners[rid]}", same]
            else:
                owners[rid], segments[rid] = number, line.segments
    too_long = {rid: n for rid, n in owners.items() if lines[n - 1].is_too_long}
    results = {rid: n for rid, n in owners.items() if rid not in too_long}
    return Expected(owners, results, too_long, bad, segments, blank)


def flat_texts(segments: Segments) -> list[str]:
    """The system and user texts of a record's last request, in order: every segment's turns (the model's
    answers in between are not in it) — what `--sim-answer-digest` digests."""
    return [turn["content"] for segment in segments for turn in segment]
