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
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from fleetgen.plan.job import OutputLengths

FILLER = " x"  # one token apiece in the BPE vocabularies of the models served (Qwen, Llama): the written part


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
    _started: set[int] = field(default_factory=set)

    def apply(self, body: dict[str, Any], key: int) -> dict[str, Any]:
        if key not in self._started and len(self._started) < self.under_way:
            self._started.add(key)
        if key not in self._started:
            return body | forced_length(self.lengths, key)
        whole, written = under_way(self.lengths, key)
        return _with_written(body, written) | {"max_tokens": whole - written, "ignore_eos": True}


def _with_written(body: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The body with `tokens` filler tokens after its last message's text (a message of its own where that
    is not plain text)."""
    if tokens == 0:
        return body
    messages = list(body["messages"])
    last = messages[-1]
    if isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": last["content"] + FILLER * tokens}
    else:
        messages.append({"role": "user", "content": FILLER * tokens})
    return {**body, "messages": messages}
