"""Output lengths forced on requests (`tune` on dummy weights, or lengths given), and the steady start.

Each request writes a length drawn from the job's distribution (`max_tokens` + `ignore_eos`, seeded by its
work key: the same request writes the same length on every server tune measures). A batch that starts
empty is not the job's batch: every request is at its start, contexts are short, none ends for minutes, so
a window right after the fill reads a decode rate above the steady one (4,398 vs ~3,660 tok/s for the same
setting on the H200) and completions/s near zero. The steady start sends the first `under_way` requests
as requests caught mid-flight: whole lengths drawn in proportion to the length (a long request is in
flight for longer), the part already written uniform over it, sent as that many filler tokens after the
prompt (the KV it holds) and the rest as its `max_tokens`. The batch then holds the job's steady mix of
contexts from the start, and its requests end at the steady rate.

The filler is counted with the model's own tokenizer where it is readable (`filler_for`): " x" is two tokens
(" " and "x") in the H200 bundle's tokenizer (a BPE trained on tests/data/corpus, padded to Qwen3.6's
vocabulary), so an assumed one-token filler doubled every written part there and sent requests past the
context the job needs (vLLM refused them). Without the tokenizer, " the" is assumed one token (it is in the
BPE and SentencePiece vocabularies of the models served); `Filler` says so.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetgen.errors import ConfigError
from fleetgen.plan.job import OutputLengths

# Filler units tried in order: the first that the model's tokenizer counts as one token a repetition, however
# many are repeated, stands for the written part (else the fewest tokens a repetition, counted exactly).
UNITS = (" the", " a", " and", " x", ".")
PROBE_REPEATS = (1, 2, 63, 64)  # repetitions counted to show a unit's count does not depend on its neighbours
PROBE_TEXT = "Explain why."  # and after a prompt's text: the first unit does not merge into it


@dataclass(frozen=True)
class Filler:
    """What stands for the part of a request already written: `unit` repeated, `unit_tokens` tokens apiece,
    and how that count is known (`counted_with`; `is_assumed` without the model's tokenizer)."""

    unit: str = " the"
    unit_tokens: int = 1
    counted_with: str = "assumed: no tokenizer of the model readable here"
    is_assumed: bool = True

    def text_for(self, tokens: int) -> tuple[str, int]:
        """The filler for at most `tokens` tokens, and the tokens it holds (whole units only)."""
        units = tokens // self.unit_tokens
        return self.unit * units, units * self.unit_tokens


def filler_for(count: Callable[[str], int], counted_with: str) -> Filler:
    """The filler for a tokenizer (`count`: the tokens of a text): the first unit of `UNITS` whose count is
    one a repetition, else the fewest (each checked to count the same per repetition, however many); a
    tokenizer with no such unit is refused (the steady start could not say what the batch holds)."""
    exact = []
    for unit in UNITS:
        each, base = count(unit), count(PROBE_TEXT)
        if each >= 1 and all(count(PROBE_TEXT + unit * n) == base + n * each for n in PROBE_REPEATS):
            exact.append((each, unit))
            if each == 1:
                break
    if not exact:
        raise ConfigError(
            f"no filler counts exactly in the model's tokenizer ({counted_with}): tried {list(UNITS)}",
            fix="start the batch empty (--no-steady-start)",
        )
    each, unit = min(exact, key=lambda e: e[0])
    return Filler(unit, each, counted_with, is_assumed=False)


def forced_length(lengths: OutputLengths, key: int) -> dict[str, Any]:
    """The fields that make one request write exactly a length drawn from `lengths` (seeded by its work
    key): `max_tokens` and `ignore_eos`, a sampling field SGLang and vLLM both read from the chat body."""
    return {"max_tokens": lengths.sample(random.Random(key)), "ignore_eos": True}


def under_way(lengths: OutputLengths, key: int) -> tuple[int, int]:
    """A request caught mid-flight in a steady batch (seeded by its work key): its whole length, drawn
    with probability in proportion to the length (rejection from `lengths`), and what it has written,
    uniform in [0, whole)."""
    rng = random.Random(f"under-way:{key}")
    longest = lengths.stats.max
    while True:
        whole = lengths.sample(rng)
        if rng.random() * longest < whole:
            return whole, rng.randrange(whole)


@dataclass
class ForcedLengths:
    """Forced lengths on the bodies `run`'s dispatcher sends; the first `under_way` requests (by work key,
    a retry keeps its draw) start as requests already under way."""

    lengths: OutputLengths
    under_way: int = 0
    filler: Filler = field(default_factory=Filler)
    _started: set[int] = field(default_factory=set)

    def apply(self, body: dict[str, Any], key: int) -> dict[str, Any]:
        if key not in self._started and len(self._started) < self.under_way:
            self._started.add(key)
        if key not in self._started:
            return body | forced_length(self.lengths, key)
        whole, written = under_way(self.lengths, key)
        text, tokens = self.filler.text_for(written)
        return _with_written(body, text) | {"max_tokens": whole - tokens, "ignore_eos": True}


def _with_written(body: dict[str, Any], filler: str) -> dict[str, Any]:
    """The body with `filler` after its last message's text (a message of its own where that is not plain
    text)."""
    if not filler:
        return body
    messages = list(body["messages"])
    last = messages[-1]
    if isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": last["content"] + filler}
    else:
        messages.append({"role": "user", "content": filler})
    return {**body, "messages": messages}
