"""What a running job reports: progress snapshots, the final summary, and the resume position tracker.

Counts come from committed rows only (the writer's `on_commit`), so what the progress shows is on disk.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from fleetgen.deploy.readiness import Readiness
from fleetgen.generate.health import Endpoint
from fleetgen.generate.ledger.store import Counts
from fleetgen.generate.source import Position

RATE_WINDOW_S = 10.0


@dataclass
class Counters:
    """Committed rows of this run, and what the store held before it."""

    results: int = 0
    errors: int = 0
    bad: int = 0
    truncated: int = 0
    output_tokens: int = 0
    # What the store held; the re-run modes (--retry-errors, --redo-truncated) show only this run's rows.
    before: Counts = field(default_factory=Counts)


@dataclass(frozen=True)
class EndpointProgress:
    """One endpoint in the live view."""

    name: str
    readiness: Readiness
    in_flight: int
    cap: int
    completions: int
    completions_per_s: float
    last_error: str

    @classmethod
    def of(cls, e: Endpoint, completions_per_s: float = 0.0) -> EndpointProgress:
        return cls(e.name, e.readiness, e.in_flight, e.cap, e.completions, completions_per_s, e.last_error)


@dataclass(frozen=True)
class Progress:
    """A snapshot of the job, emitted every ~0.5 s through the runner's callback (nothing done: zeros)."""

    done: int = 0
    total: int | None = None
    completions_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    eta_s: float | None = None
    errors: int = 0
    truncated: int = 0
    bad_inputs: int = 0
    in_flight: int = 0
    retrying: int = 0
    elapsed_s: float = 0.0
    stopping: bool = False
    endpoints: list[EndpointProgress] = field(default_factory=list)
    waiting_s: float | None = None  # no server ready (yet, or any more): seconds left to wait for one
    is_final: bool = False  # the job's end: the rates are its averages


@dataclass(frozen=True)
class BadInputSample:
    """One bad input line for the summary."""

    source: str
    line: int
    reason: str


# how a run ended: "failed" is complete but with no result in the store (a job that reaches no server
# raises FleetDown instead of returning)
RunEnd = Literal["complete", "failed", "stopped"]


@dataclass(frozen=True)
class Summary:
    """The end of a run: what was done this run and what the store holds now."""

    status: RunEnd
    out_dir: str
    model: str
    completions_this_run: int
    output_tokens_this_run: int
    errors_this_run: int
    elapsed_s: float
    results: int
    errors: int
    truncated: int
    bad_inputs: int
    bad_input_samples: list[BadInputSample]
    endpoints: dict[str, int]

    @property
    def completions_per_s(self) -> float:
        return self.completions_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0


class RateMeter:
    """Rates over a sliding window (`RATE_WINDOW_S`) of (time, count) samples."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, count: float) -> float:
        """Record the running `count`; return its rate per second over the window."""
        now = time.monotonic()
        self._samples.append((now, count))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        t0, c0 = self._samples[0]
        return (count - c0) / (now - t0) if now > t0 else 0.0


class PositionTracker:
    """The resume position: the longest prefix of input lines whose every sample is committed.

    Lines are opened in input order with the number of rows they still owe; committed rows pay them off.
    The position only moves past a line when it and every line before it are paid — so a rerun that starts
    there skips nothing that is not on disk.
    """

    def __init__(self, start: Position) -> None:
        self.position = start
        self._open: deque[tuple[int, int]] = deque()
        self._owed: dict[int, int] = {}

    def open(self, line: int, end_offset: int, num_rows: int) -> None:
        if num_rows == 0 and not self._open:  # resume skipping done lines: no bookkeeping needed
            self.position = Position(line, end_offset)
            return
        self._open.append((line, end_offset))
        self._owed[line] = self._owed.get(line, 0) + num_rows
        self.advance()

    def paid(self, line: int) -> None:
        if line in self._owed:
            self._owed[line] -= 1

    def advance(self) -> None:
        while self._open and self._owed.get(self._open[0][0], 0) <= 0:
            line, offset = self._open.popleft()
            self._owed.pop(line, None)
            self.position = Position(line, offset)
