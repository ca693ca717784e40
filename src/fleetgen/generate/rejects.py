"""Requests the servers refuse: a record's problem, or the job's?

A 4xx other than backpressure (408/409/425/429) says the request is wrong. When one record's request is wrong
(its prompt is too long), the record gets an error row and the job goes on. When every request is wrong the
same way (a sampling parameter the server refuses, `max_tokens` beyond the model's context), the job itself is
wrong: the same refusal `threshold` times in a row, with no success between, stops it with RequestRejected,
quoting the server and naming the parameter it most likely means. The refused requests of such a streak are
held back, never written as error rows: the rerun after the fix does them again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
    """Consecutive refusals with one signature since the last success; `held` are not written yet."""

    threshold: int
    key: str = ""
    held: list[tuple[str, Work, RequestFailed]] = field(default_factory=list)

    def add(self, endpoint: str, work: Work, exc: RequestFailed) -> list[tuple[str, Work, RequestFailed]]:
        """Hold this refusal; return the held ones it shows to be per-record (another kind came)."""
        key = signature(exc)
        released = self.release() if key != self.key else []
        self.key = key
        self.held.append((endpoint, work, exc))
        return released

    @property
    def is_the_jobs(self) -> bool:
        return len(self.held) >= self.threshold

    def release(self) -> list[tuple[str, Work, RequestFailed]]:
        """A success (or the end): the held refusals were the records' own; they become error rows."""
        held, self.held, self.key = self.held, [], ""
        return held

    def error(self, body: Mapping[str, Any]) -> RequestRejected:
        _, _, exc = self.held[-1]
        by = ", ".join(sorted({endpoint for endpoint, _, _ in self.held}))
        where = suspects(exc.message, body)
        likely = f"; likely: {', '.join(where)}" if where else ""
        return RequestRejected(
            f"every request is refused by the servers with HTTP {exc.status}: the request is wrong, not the "
            f"fleet{likely}",
            context={
                "server says": exc.message,
                "refused": f"{len(self.held)} requests in a row, by {by}, none succeeded; none was written "
                "as an error row",
            },
            fix="change what the server names (in the job file given with --job, or the flag that sets it), "
            "then rerun the same command: nothing was written, so the folder takes the changed parameters",
        )
