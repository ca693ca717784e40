"""Wait for a freshly spawned engine to become ready, reading its log as it grows.

One SSH round trip per poll reads the process's /proc stat line *then* the log bytes appended since the last
poll (stat first, so when the process is found dead the log already holds its last words). Every new line is
matched against the engine's fatal signatures and a few generic ones; the health endpoint is polled through
the tunnel. What that means is `deploy.readiness.decide`'s: DOWN (fatal line, process gone) or READY ends the
wait at once, as does the timeout; a DOWN start is explained here from its log (the root-cause exception).
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from fleetgen.deploy.death import (
    GENERIC_SIGNATURES,
    POINTS_ELSEWHERE,
    Death,
    first_fatal,
    last_frame,
    root_cause,
    shortened,
)
from fleetgen.deploy.readiness import Readiness, Seen, decide
from fleetgen.engines.base import Engine, FatalSignature
from fleetgen.engines.rules import RuleSet
from fleetgen.errors import LaunchFailed, ReadyTimeout, tail
from fleetgen.http.client import EngineClient
from fleetgen.remote.base import Host
from fleetgen.remote.procfs import parse_stat
from fleetgen.remote.scripts import sh

# Tail of the log carried by an error.
NUM_ERROR_LINES = 25
# After a fatal line the engine still logs the traceback or message that follows it, then exits: read every
# SETTLE_S until it has, for at most LAST_WORDS_S (SGLang 0.5.17 logged its cause a second after that line).
SETTLE_S = 0.3
LAST_WORDS_S = 5.0

# $4/$5 (first poll only): point $4/current.log at $5, relative, replaced atomically (ln + mv -T).
POLL_SH = r"""
pid=$1 log=$2 off=$3
if [ -n "${4:-}" ]; then
  (cd -- "$4" && ln -sfn -- "$5" current.log.tmp && mv -Tf -- current.log.tmp current.log) || true
fi
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || stat=""
printf '%s\n' "$stat"
tail -c "+$((off + 1))" -- "$log" 2>/dev/null | head -c 1048576
exit 0
"""


@dataclass
class LaunchLog:
    """What the wait has seen of one launch: log lines, byte offset, process liveness."""

    log_path: str
    lines: list[str] = field(default_factory=list)
    offset: int = 0
    partial: str = ""
    is_alive: bool = True
    is_linked: bool = False

    def feed(self, data: bytes) -> list[str]:
        """Append raw log bytes; return the complete new lines."""
        self.offset += len(data)
        text = self.partial + data.decode(errors="replace")
        *complete, self.partial = text.split("\n")
        new = [line.rstrip("\r") for line in complete]
        self.lines += new
        return new

    def tail_text(self) -> str:
        extra = [self.partial] if self.partial else []
        return tail("\n".join(self.lines + extra), NUM_ERROR_LINES)


def proc_state(stat_line: str, start_time: int) -> bool:
    """Alive per a /proc/PID/stat line: present, same start time (no PID reuse), not a zombie."""
    stat = parse_stat(stat_line)
    return stat is not None and not stat.is_dead and stat.start_time == start_time


async def poll_once(host: Host, launch_log: LaunchLog, pid: int, start_time: int) -> list[str]:
    """One round trip: liveness, then the new log bytes. Returns the new complete lines.

    The first poll also points `current.log` at this launch's log (saving a round trip of its own).
    """
    link = [] if launch_log.is_linked else list(posixpath.split(launch_log.log_path))
    result = await host.run(sh(POLL_SH, str(pid), launch_log.log_path, str(launch_log.offset), *link))
    launch_log.is_linked = True
    stat_line, _, rest = result.stdout.partition("\n")
    launch_log.is_alive = proc_state(stat_line, start_time)
    return launch_log.feed(rest.encode())


@dataclass(frozen=True)
class StartedProcess:
    """The launch being waited on."""

    instance: str
    host: Host
    pid: int
    start_time: int
    log_path: str


async def wait_ready(
    proc: StartedProcess,
    engine: Engine,
    client: EngineClient,
    *,
    rules: RuleSet,
    timeout_s: float,
    progress: Callable[[str], None] | None = None,
) -> LaunchLog:
    """Return once the engine answers its health endpoint; raise LaunchFailed or ReadyTimeout otherwise.
    `rules`: the rule set that decided the launch; a fatal line's fix is that release's."""
    launch_log = LaunchLog(proc.log_path)
    own = engine.fatal_signatures_for(rules)
    signatures = (*own, *GENERIC_SIGNATURES)
    since = last_report = time.monotonic()
    while True:
        new = await poll_once(proc.host, launch_log, proc.pid, proc.start_time)
        fatal = first_fatal(new, own)
        seen = Seen(fatal=fatal[1] if fatal else "", is_alive=launch_log.is_alive)
        if decide(seen).readiness is Readiness.DOWN:  # health cannot change that: not asked
            await _last_words(proc, launch_log, LAST_WORDS_S if fatal else 0.0)
            if fatal:  # the whole log's most specific line: the first one seen may be a consequence (SGLang
                # 0.5.17 logged "CUDA error: the operation cannot be performed" a second before the "CUDA
                # error: out of memory" that caused it, in its prefill CUDA graph's capture)
                fatal = first_fatal(launch_log.lines, own) or fatal
            raise _failed(proc, launch_log, signatures, fatal)
        seen = replace(seen, is_healthy=await client.is_healthy(engine.health_path))
        if decide(seen).readiness is Readiness.READY:
            return launch_log
        elapsed = time.monotonic() - since
        if elapsed > timeout_s:
            raise ReadyTimeout(
                f"{proc.instance}: not healthy after {timeout_s:.0f}s (the process still runs)",
                fix="big models take minutes to load: raise engine.ready_timeout_s; if the log stopped "
                f"moving, read it with `fleetgen logs {proc.instance}`",
                context=_context(proc, launch_log),
            )
        if progress and time.monotonic() - last_report >= 5.0:
            last_report = time.monotonic()
            last = launch_log.lines[-1][:120] if launch_log.lines else "(log empty so far)"
            progress(f"waiting for health, {elapsed:.0f}s / {timeout_s:.0f}s; log: {last}")
        await asyncio.sleep(0.25)


async def _last_words(proc: StartedProcess, launch_log: LaunchLog, wait_s: float) -> None:
    """Read what the engine logs as it dies: once, then until it exits (at most `wait_s`): after its first
    fatal line an engine still logs the traceback that names the cause, and then exits."""
    deadline = time.monotonic() + wait_s
    await poll_once(proc.host, launch_log, proc.pid, proc.start_time)
    while launch_log.is_alive and time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_S)
        await poll_once(proc.host, launch_log, proc.pid, proc.start_time)


def _context(proc: StartedProcess, launch_log: LaunchLog, **extra: object) -> dict[str, object]:
    return {
        "instance": proc.instance,
        "host": proc.host.name,
        "pid": proc.pid,
        "log": proc.log_path,
        **extra,
        "log tail": launch_log.tail_text(),
    }


def _failed(
    proc: StartedProcess,
    launch_log: LaunchLog,
    signatures: Sequence[FatalSignature],
    fatal: tuple[FatalSignature, str] | None = None,
) -> LaunchFailed:
    """Why a start failed: `fatal`, the fatal line that ended the wait, or (None) the process exited. The
    root-cause exception is named when the process exited or the engine's words put the cause elsewhere."""
    lines = [*launch_log.lines, launch_log.partial]
    headline = f"{proc.instance}: " + (fatal[0].cause if fatal else "the process exited while starting")
    if fatal is None or POINTS_ELSEWHERE.search(fatal[1]):
        root = root_cause(lines)
        if root is not None:
            known = first_fatal([root], signatures)
            cause = f"{known[0].cause}: " if known and known[0].cause not in headline else ""
            matched = (fatal[1] if fatal else root).strip()[:300]
            return LaunchFailed(
                f"{headline}: {cause}{root}",
                fix=known[0].fix if known else "read the traceback that ends with it in the log",
                context=_context(proc, launch_log, matched=matched, **{"root cause": root[:300]}),
            )
    if fatal is None and (found := first_fatal(lines, signatures)):
        headline, fatal = f"{headline}: {found[0].cause}", found
    if fatal is None:
        return LaunchFailed(
            f"{headline} (killed, or it stopped without logging a known error)",
            fix=f"read the log ({proc.log_path}); if it was killed (OOM killer, a person), "
            "check `dmesg` on the host, then run `fleetgen up` again",
            context=_context(proc, launch_log),
        )
    line = fatal[1].strip()  # the engine's own words, and where its traceback was when it raised them
    said = Death(headline, shortened(line), last_frame(lines, line), fatal[0].fix).text()
    return LaunchFailed(
        said,
        fix=fatal[0].fix,
        context=_context(proc, launch_log, matched=line[:300]),
    )
