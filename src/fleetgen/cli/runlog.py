"""`fleetgen run` off a terminal (a pipe, `nohup`, a tmux log) or with `--no-live`: a log, not a frame.

One plain line of progress every `--log-every` seconds and at the end (with the job's averages); a line at
once when an instance goes down or comes back, and when the fleet says why one is down in other words than
the failed request did (a Slurm job's end: CANCELLED, PREEMPTED, TIMEOUT, NODE_FAIL); and when every
instance is down, at once, each one's reason and what the job does meanwhile (waits, restarts, or stops
with FleetDown when the wait runs out).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetgen.deploy.readiness import Readiness
from fleetgen.generate.progress import Progress


def duration(seconds: float | None) -> str:
    """h:mm:ss, or – when unknown."""
    if seconds is None:
        return "–"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_line(p: Progress) -> str:
    """One line of totals: a line of the plain log, and the live view's head."""
    total = p.total
    share = f" ({100 * p.done / total:.1f}%)" if total else ""
    ready = sum(e.readiness is Readiness.READY for e in p.endpoints)
    rates = "average " if p.is_final else ""
    waiting = f"  no server ready: stopping in {p.waiting_s:.0f} s" if p.waiting_s is not None else ""
    return (
        f"[{duration(p.elapsed_s)}] {p.done}/{total if total is not None else '?'}{share}  "
        f"{rates}{p.completions_per_s:.1f} compl/s  {p.output_tokens_per_s:.0f} tok/s  "
        f"ETA {duration(p.eta_s) if not p.is_final else '–'}  errors {p.errors}  truncated {p.truncated}  "
        f"bad input {p.bad_inputs}  in flight {p.in_flight}  retrying {p.retrying}  "
        f"ready {ready}/{len(p.endpoints)}{waiting}"
    )


class PlainLog:
    """The `on_progress` callback of a job run off a terminal; prints through `say` (the CLI's stderr).

    `meanwhile` says what the job does while no instance is ready (wait how long, how to bring them back).
    """

    def __init__(
        self, say: Callable[[str], None], *, every_s: float, meanwhile: Callable[[float], str]
    ) -> None:
        self._say = say
        self._every_s = every_s
        self._meanwhile = meanwhile
        self._last_line = time.monotonic()
        self._readiness: dict[str, Readiness] = {}
        self._reasons: dict[str, str] = {}
        self._all_down = False

    def __call__(self, p: Progress) -> None:
        if p.total is None and p.done == 0 and p.waiting_s is not None:  # the start-up wait
            if self._is_due():  # `run` said at once which instances are not ready; then, now and then:
                states = "; ".join(
                    f"{e.name} ({e.readiness.value}): {e.last_error or 'not ready'}" for e in p.endpoints
                )
                left = f"{p.waiting_s:.0f} s"
                self._say(f"[{duration(p.elapsed_s)}] no server ready yet, waiting {left} more: {states}")
            return
        self._changes(p)
        if p.is_final or self._is_due():
            self._say(progress_line(p))

    def _is_due(self) -> bool:
        now = time.monotonic()
        if now - self._last_line < self._every_s:
            return False
        self._last_line = now
        return True

    def _changes(self, p: Progress) -> None:
        """A line per instance that went down or came back; the whole picture when none is left."""
        all_down = p.waiting_s is not None and not p.is_final
        for e in p.endpoints:
            was_ready = self._readiness.get(e.name, Readiness.READY) is Readiness.READY
            is_ready = e.readiness is Readiness.READY
            self._readiness[e.name] = e.readiness
            if was_ready and not is_ready and not all_down:
                why = e.last_error or "no reason known yet"
                self._say(f"{e.name} is {e.readiness.value}: {why}; the others go on")
                self._reasons[e.name] = e.last_error
            elif e.readiness is Readiness.DOWN and not all_down and e.last_error != self._reasons.get(e.name):
                self._say(f"{e.name} is down: {e.last_error}")  # the fleet's own why (a Slurm job's end)
                self._reasons[e.name] = e.last_error
            elif is_ready and not was_ready:
                self._say(f"{e.name} is ready again: it takes work")
        if all_down:
            if not self._all_down:
                self._say(f"every instance is down: {self._meanwhile(p.waiting_s or 0.0)}")
            for e in p.endpoints:  # each reason at once, again when the fleet's own replaces the request's
                if not self._all_down or e.last_error != self._reasons.get(e.name):
                    self._reasons[e.name] = e.last_error
                    self._say(f"  {e.name} ({e.readiness.value}): {e.last_error or 'no reason known yet'}")
        self._all_down = all_down
