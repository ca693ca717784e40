"""Requests the servers refuse: a record's problem, or the job's?

A 4xx other than backpressure (408/409/425/429) says the request is wrong. When one record's request is wrong
(its prompt is too long), the record gets an error row and the job goes on. When every request is wrong the
same way (a sampling parameter the server refuses, `max_tokens` beyond the model's context), the job itself is
wrong: it stops with RequestRejected, quoting the server and naming the parameter it most likely means.

"Every request" is judged in send order, not in the order answers arrive: a refusal comes back in
milliseconds while a generation takes minutes, so a healthy job whose longest records are past the server's
context meets many refusals in its first few hundred sends before any request completes. The dispatcher
numbers each request when it first sends it (`sent`); a retry (a 5xx, a timeout, a drained endpoint) keeps
the number, for no server has judged that request yet. A request is judged when it is refused (`refused`),
succeeds or runs out of retries (`ended`). The job is wrong when `threshold` consecutive numbers are all
refused with one signature (`is_the_jobs`); a request between them that the server took, or that is still in
flight, breaks the run until it too is refused alike.

A refusal is held, not written, while it may still belong to such a run: while some `threshold` consecutive
numbers around it are each refused alike, in flight, or not sent yet. Once every such window holds a request
judged otherwise (a success, another refusal, retries run out), it is the record's own and is released, to
become an error row. A window only ever loses candidates, so a released refusal never joins a run: each
refusal ends once, as an error row or held back by the RequestRejected that stops the job (the rerun after the
fix sends it again). Memory is bounded: a held refusal lies within `threshold` of a request in flight or of
the next send: at most 2 × `threshold` of them per request in flight.

At the end of the work the refusals still held are the records' own, unless nothing succeeded at all and they
are one refusal repeated (a small job whose every request is wrong): then RequestRejected as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgen.errors import RequestRejected
from fleetgen.generate.work import Work
from fleetgen.http.client import CONTEXT_MARKERS, RequestFailed

# A request body field → where the job sets it (job-file key, and the `run` flag where there is one).
SOURCES = {
    "model": "`model` in the job file",
    "max_tokens": "`max_tokens` in the job file / --max-tokens",
    "temperature": "`temperature` in the job file / --temperature",
    "top_p": "`top_p` in the job file / --top-p",
    "top_k": "`top_k` in the job file / --top-k",
    "seed": "`seed` in the job file / --seed",
    "chat_template_kwargs": "`thinking` in the job file / --thinking, --no-thinking",
    "enable_thinking": "`thinking` in the job file / --thinking, --no-thinking",
    "messages": "the input records (`prompt_field`, `system_prompt` in the job file)",
}

Refusal = tuple[str, Work, RequestFailed]  # endpoint, work, what the server said: an error row once released


def signature(exc: RequestFailed) -> str:
    """The refusal with its numbers blanked: "you requested 4100 tokens (100 in the messages…)" is one."""
    return f"{exc.status}:{re.sub(r'[0-9]+', 'N', exc.message)}"


def suspects(message: str, body: Mapping[str, Any]) -> list[str]:
    """Where the job sets the request fields the server's message names (context-length refusals: max_tokens
    and the prompts); `extra_body` keys by their own name."""
    text = message.lower()
    keys = [*body, *(str(k) for value in body.values() if isinstance(value, Mapping) for k in value)]
    named = [k for k in keys if re.search(rf"(?<![a-z_]){re.escape(k.lower())}(?![a-z_])", text)]
    if any(marker in text for marker in CONTEXT_MARKERS):  # "the model's maximum context length": not `model`
        first = ("max_tokens", "messages")
        named = [*first, *(k for k in named if k not in (*first, "model"))]
    return list(dict.fromkeys(SOURCES.get(k, f"`extra_body.{k}` in the job file") for k in named))


@dataclass
class Streak:
    """Refusals by send number; `held` (number → signature, refusal) are those a run may still hold."""

    threshold: int
    num_sent: int = 0
    in_flight: set[int] = field(default_factory=set)  # sent, not judged yet (waiting retries included)
    held: dict[int, tuple[str, Refusal]] = field(default_factory=dict)
    run: range = range(0)  # `threshold` or more consecutive numbers refused alike: the job is wrong

    def sent(self) -> int:
        """Number a request's first send (its retries keep the number)."""
        number = self.num_sent
        self.num_sent += 1
        self.in_flight.add(number)
        return number

    def refused(self, number: int, refusal: Refusal) -> list[Refusal]:
        """Request `number` was refused: hold it; return the held refusals now shown to be the records'."""
        self.in_flight.discard(number)
        key = signature(refusal[2])
        self.held[number] = (key, refusal)
        if not self.run:
            run = self._around(number, lambda n: n in self.held and self.held[n][0] == key)
            self.run = run if len(run) >= self.threshold else range(0)
        return self._settle(number)

    def ended(self, number: int) -> list[Refusal]:
        """Request `number` was judged and not refused (it succeeded, or ran out of retries): return the held
        refusals it shows to be the records' own."""
        self.in_flight.discard(number)
        return self._settle(number)

    @property
    def is_the_jobs(self) -> bool:
        return bool(self.run)

    @property
    def is_one_repeated(self) -> bool:
        """Two or more refusals held, all alike: with no success at all, the job's, however few."""
        return len(self.held) >= 2 and len({key for key, _ in self.held.values()}) == 1

    def release(self) -> list[Refusal]:
        """The end of the work: the held refusals were the records' own; they become error rows."""
        held, self.held = self.held, {}
        return [refusal for _, (_, refusal) in sorted(held.items())]

    def _settle(self, number: int) -> list[Refusal]:
        """Release the held refusals that no run can hold since `number` was judged. Only those within
        `threshold` of it can change: a farther one keeps the `threshold` numbers between them."""
        near = range(number - self.threshold + 1, number + self.threshold)
        shown = [n for n in near if n in self.held and len(self._room(n)) < self.threshold]
        return [self.held.pop(n)[1] for n in shown]

    def _room(self, number: int) -> range:
        """The consecutive numbers around held `number` that are, or may yet be, refused like it (up to
        `threshold` of them: enough to decide)."""
        key = self.held[number][0]

        def may(n: int) -> bool:
            return n >= self.num_sent or n in self.in_flight or (n in self.held and self.held[n][0] == key)

        return self._around(number, may, self.threshold)

    @staticmethod
    def _around(number: int, belongs: Callable[[int], bool], most: int | None = None) -> range:
        """The consecutive numbers around `number` (which belongs) that belong, up to `most` of them."""
        low = high = number
        while (most is None or high - low + 1 < most) and belongs(low - 1):
            low -= 1
        while (most is None or high - low + 1 < most) and belongs(high + 1):
            high += 1
        return range(low, high + 1)

    def error(self, body_for: Callable[[Work], Mapping[str, Any]]) -> RequestRejected:
        """The run (or, at the end, the refusals held) as the job's error, naming what it most likely is."""
        refusals = [self.held[n][1] for n in (self.run or sorted(self.held))]
        _, work, exc = refusals[-1]
        by = ", ".join(sorted({endpoint for endpoint, _, _ in refusals}))
        where = suspects(exc.message, body_for(work))
        likely = f"; likely: {', '.join(where)}" if where else ""
        return RequestRejected(
            f"every request is refused by the servers with HTTP {exc.status}: the request is wrong, not the "
            f"fleet{likely}",
            context={
                "server says": exc.message,
                "refused": f"{len(refusals)} requests sent in a row, by {by}, all alike; none of them was "
                "written as an error row",
            },
            fix="change what the server names (in the job file given with --job, or the flag that sets it), "
            "then rerun the same command: the refused requests were not written, so they are sent again (a "
            "folder with no rows takes the changed parameters; one with rows made before asks which to keep)",
        )
