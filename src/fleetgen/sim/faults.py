"""Whole-server faults: a SIMULATION knob, for driver tests (chaos, retries, hung detection).

A real SGLang server has no such thing: `POST /sim/fault` exists only in `fleetgen.sim` (the sim is never a
real engine), behind the server's `--api-key` like every non-health route. Body `{"mode": MODE, "seconds":
N | null}`: the fault holds for N seconds (then the server is back to `ok`), or until the next change;
`GET /sim/fault` says which is on. `--sim-fault MODE` starts the server with one (no end).

Modes, each what a client sees of a server failing that way:
- `ok`: no fault;
- `http_500`, `http_503`: every generation request answered with that status, in SGLang's error body;
- `drop`: a generation request's connection closed without an answer (a crashed worker behind a live port);
- `hang`: every request (health and info included) accepted and never answered, as a process stuck whole;
- `stall`: generation requests accepted and never given a token while `/health` and `/health_generate` still
  answer 200 — SGLang's health check can vouch for a scheduler that produces nothing (sgl-project/sglang
  #6624: `/health_generate` 200 with no token generated; #30314: `/health` 200 while nothing is generated).

A request held by `hang` or `stall` stays unanswered while the fault lasts; when it ends (its seconds run out
or another mode is set) the connection is closed without an answer: the work it carried is lost, as a hung
process's is when it comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CONTROL_PATH = "/sim/fault"
GENERATION_PATHS = frozenset({"/v1/chat/completions"})
HEALTH_PATHS = frozenset({"/health", "/health_generate", "/ready"})


class FaultMode(enum.StrEnum):
    """What the simulated server does with requests (see the module docstring)."""

    OK = "ok"
    HTTP_500 = "http_500"
    HTTP_503 = "http_503"
    DROP = "drop"
    HANG = "hang"
    STALL = "stall"


class Action(enum.Enum):
    """What one request meets under the fault now on."""

    SERVE = "serve"
    ANSWER_500 = "answer_500"
    ANSWER_503 = "answer_503"
    DROP = "drop"
    HOLD = "hold"  # no answer while the fault lasts, then the connection closed


@dataclass
class Fault:
    """The fault a server is under: its mode and when it ends (`clock` seconds; None: until changed)."""

    clock: Callable[[], float] = time.monotonic
    _mode: FaultMode = FaultMode.OK
    _until: float | None = None
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def set(self, mode: FaultMode, seconds: float | None = None) -> None:
        """Put the server under `mode`, for `seconds` (None: until the next change); wakes held requests."""
        if seconds is not None and seconds < 0:
            raise ValueError(f"seconds must be >= 0 or null, got {seconds}")
        self._mode = mode
        self._until = None if seconds is None or mode is FaultMode.OK else self.clock() + seconds
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    @property
    def mode(self) -> FaultMode:
        """The mode on now (a bounded fault whose seconds ran out is `ok`)."""
        if self._until is not None and self.clock() >= self._until:
            self._mode, self._until = FaultMode.OK, None
        return self._mode

    @property
    def seconds_left(self) -> float | None:
        """Seconds until the fault ends by itself; None when it lasts until changed (or none is on)."""
        if self.mode is FaultMode.OK or self._until is None:
            return None
        return max(0.0, self._until - self.clock())

    def action(self, path: str) -> Action:
        """What a request for `path` meets now; the control path is never faulted."""
        mode = self.mode
        if path == CONTROL_PATH or mode is FaultMode.OK:
            return Action.SERVE
        if mode is FaultMode.HANG:
            return Action.HOLD
        if path not in GENERATION_PATHS:
            return Action.SERVE
        return {
            FaultMode.HTTP_500: Action.ANSWER_500,
            FaultMode.HTTP_503: Action.ANSWER_503,
            FaultMode.DROP: Action.DROP,
            FaultMode.STALL: Action.HOLD,
        }[mode]

    async def held(self, path: str) -> None:
        """Return once a request for `path` is no longer held (the fault ended or changed)."""
        while self.action(path) is Action.HOLD:
            if self._changed is None:
                self._changed = asyncio.Event()
            left = self.seconds_left
            with contextlib.suppress(TimeoutError):  # its seconds ran out: `action` sees it
                await asyncio.wait_for(self._changed.wait(), left)


def parse_fault(body: object) -> tuple[FaultMode, float | None]:
    """`{"mode": …, "seconds": N | null}` → (mode, seconds); ValueError naming what is wrong."""
    if not isinstance(body, dict):
        raise ValueError('expected a JSON object {"mode": MODE, "seconds": N | null}')
    unknown = set(body) - {"mode", "seconds"}
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}: the fields are mode and seconds")
    modes = ", ".join(m.value for m in FaultMode)
    try:
        mode = FaultMode(str(body.get("mode")))
    except ValueError:
        raise ValueError(f"mode must be one of {modes}, got {body.get('mode')!r}") from None
    seconds = body.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)):
        raise ValueError(f"seconds must be a number or null, got {seconds!r}")
    if seconds is not None and seconds < 0:
        raise ValueError(f"seconds must be >= 0 or null, got {seconds!r}")
    return mode, None if seconds is None else float(seconds)
