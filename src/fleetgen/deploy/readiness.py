"""Whether an instance takes work: THE place the tree decides it (`decide`), from what a reader observed.

Four readers look at an instance, each its own way, and all hand what they saw (`Seen`) to `decide`:
- `up` waiting for a launch (`deploy/readywait.py`): each poll, /proc and the log's new lines, then health;
- a fleet's instance (`fleet/status.py` `FleetView`, for status, run, bench, the dashboard): /proc, health,
  the port's owner, the engine's own state (`fleet/enginestate.py`), drift; Slurm, for a job not running;
- a bare URL (`dashboard/fleetdata.py`): health (its engine's state is a remark, never a condition);
- a job's endpoint (`generate/health.py`): the fleet's judgement re-read from its host (none for a bare URL),
  health, and what the job itself saw: requests failing (dispatch drains it), no progress with requests in
  flight (no request answered, its engine's samples still), a probe request's failure;
- `status` (`fleet/status.py`, with `probe`): one tiny chat request, beside health.
A reader keeps how it observes (SSH, HTTP probes, the log tail) and may stop looking once what it saw cannot
change the judgement (a dead process is DOWN whatever its health); the rules of what it means are here, first
match wins:
1. a fatal line in its log, its process seen gone, the job lost it, a probe request failed (an error reply,
   a dropped connection), the fleet says DOWN → DOWN;
2. not looked at (host unreachable, a Slurm job pending), the fleet says WAITING → WAITING;
3. requests in flight and no progress for `--hung-after` → DOWN (hung): whatever /health says where the
   engine's own moving samples are read (SGLang's /health answers 200 while its scheduler generates nothing:
   sgl-project/sglang#30314); where none is read (a bare URL without /metrics), only with health
   failing too (else a long generation would be taken for a hang);
4. health not answering 200 → WAITING where its process is seen alive (or the fleet vouches for it),
   else DOWN (a bare URL: nothing shows a process that is merely loading);
5. for a fleet's instance (its process seen): a stranger on its port, its engine's state not read (fleetgen
   launched it with metrics on, and a job's caps come from its view), drift → WAITING;
6. otherwise READY.
And a job's endpoint once down stays DOWN until it is READY again (the live view says down until it is back).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class Readiness(enum.Enum):
    """Whether an instance (an endpoint of a job) takes work; the why travels beside it (`Judgement.reason`).

    The one readiness of the tree, decided by `decide`: `status` reads it, `pool` passes it, a job's
    dispatcher and live view and the dashboard show it. The values are the words `run`'s live view and the
    dashboard print.
    """

    READY = "ready"  # runs as the fleet file says and answers: takes work
    WAITING = "waiting"  # not yet: loading, /health failing, host unreachable, drift, a stranger on its port
    DOWN = "down"  # its process is gone (in a job: or it failed requests and was drained); a restart may help


class Judgement(NamedTuple):
    """A readiness and why ("" when READY); unpacks as `readiness, why = decide(seen)`."""

    readiness: Readiness
    reason: str = ""


READY = Judgement(Readiness.READY)
NOT_RUNNING = "not running"
UNHEALTHY = "process runs but the health endpoint does not answer 200 (loading, or hung)"
NO_HEALTH = "its health endpoint does not answer 200 (nothing listens there, or it is not ready)"
DRIFT = "drift: the running process differs from the fleet file"
FLEET_WAITING = "its instance is not ready yet (as the fleet reads it)"
HUNG = "/health failing: the engine looks hung (its log says why)"
STALLED = (
    "its engine's counters and gauges stand still: the engine looks hung whatever /health says (its log "
    "says why)"
)


@dataclass(frozen=True)
class Seen:
    """What one reader observed of an instance now. A field left at its default was not observed (this
    reader cannot see it, or stopped looking once the judgement was settled) and is not held against it."""

    fatal: str = ""  # up: a fatal line in the log of the launch it waits for
    is_alive: bool | None = None  # its process, from /proc (None: no process to see, a bare URL)
    gone: str = ""  # why its process is not there, in other words than "not running" (Slurm: the job ended)
    unseen: str = ""  # why it could not be looked at: host unreachable, an SSH error, a Slurm job pending
    is_healthy: bool | None = None  # its health endpoint answered 200 (None: not asked)
    stranger: str = ""  # another process holds its port: who
    engine_problem: str = ""  # its engine's own state did not read: why
    drift: tuple[str, ...] = ()  # how the running process differs from the fleet file
    fleet: Judgement | None = (
        None  # a job's endpoint: its instance as the fleet reads it now (None: bare URL)
    )
    lost: str = ""  # a job's endpoint: why the job drained it (connection lost, requests failing)
    silent: str = ""  # a job's endpoint: requests in flight and no progress for `--hung-after`: for how long
    counted: bool = False  # a job's endpoint: its progress is read from its engine's samples too
    failing: str = ""  # a probe request (status; a drained endpoint's way back) failed: why
    was: Readiness | None = None  # a job's endpoint: its readiness until now


def decide(seen: Seen) -> Judgement:
    """The instance's readiness and why, by the rules in this module's docstring."""
    judgement = _decide(seen)
    if seen.was is Readiness.DOWN and judgement.readiness is Readiness.WAITING:
        return Judgement(Readiness.DOWN, judgement.reason)
    return judgement


def _decide(seen: Seen) -> Judgement:
    down = _down(seen)
    if down:
        return Judgement(Readiness.DOWN, down)
    fleet = seen.fleet
    if seen.unseen:
        return Judgement(Readiness.WAITING, seen.unseen)
    if fleet is not None and fleet.readiness is Readiness.WAITING:
        return Judgement(Readiness.WAITING, fleet.reason or FLEET_WAITING)
    if seen.silent and seen.counted:
        return Judgement(Readiness.DOWN, f"{seen.silent}: {STALLED}")
    if seen.silent and seen.is_healthy is not True:
        return Judgement(Readiness.DOWN, f"{seen.silent} and {HUNG}")
    if seen.is_healthy is not True:
        if seen.is_alive or fleet is not None:
            return Judgement(Readiness.WAITING, UNHEALTHY)
        return Judgement(Readiness.DOWN, NO_HEALTH)
    if seen.is_alive:
        waiting = seen.stranger or seen.engine_problem or (DRIFT if seen.drift else "")
        if waiting:
            return Judgement(Readiness.WAITING, waiting)
    return READY


def _down(seen: Seen) -> str:
    """Why it is DOWN whatever else was seen ("" when nothing says so)."""
    if seen.fatal:
        return seen.fatal
    if seen.is_alive is False:
        return seen.gone or NOT_RUNNING
    if seen.lost:
        return seen.lost
    if seen.failing:
        return f"a probe request failed: {seen.failing}"
    if seen.fleet is not None and seen.fleet.readiness is Readiness.DOWN:
        return seen.fleet.reason or NOT_RUNNING
    return ""
