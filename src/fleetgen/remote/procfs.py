"""Parse what /proc says about processes. Pure functions over bytes; the hosts fetch the bytes.

/proc/PID/stat is `pid (comm) state ppid pgrp … starttime …`; `comm` may hold spaces and parentheses, so
fields are counted after the LAST `)`. Start time is field 22 (clock ticks since boot): with the PID it
names one process for good, whereas a PID alone may be reused.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class ProcState(enum.StrEnum):
    RUNNING = "running"  # R, S, D, I, … : alive
    ZOMBIE = "zombie"  # Z or X: dead, not yet reaped (`kill -0` still succeeds: do not trust it)
    GONE = "gone"  # no such PID, or the PID now belongs to another process (start time differs)


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says of a process: state, exact argv and environ, start time."""

    pid: int
    state: ProcState
    start_time: int
    argv: tuple[str, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_alive(self) -> bool:
        return self.state is ProcState.RUNNING


_DEAD_STATES = frozenset("ZXx")  # zombie / dead: `kill -0` still succeeds on these, the process is gone


@dataclass(frozen=True)
class StatLine:
    """The fields of one /proc/PID/stat line fleetgen uses."""

    pid: int
    state: str
    pgrp: int
    start_time: int

    @property
    def is_dead(self) -> bool:
        return self.state in _DEAD_STATES


def parse_stat(text: str) -> StatLine | None:
    """One stat line, or None when it is empty or malformed (the process vanished while being read)."""
    head, sep, rest = text.strip().rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    try:
        pid = int(head.split("(", 1)[0])
        # fields[0] is stat field 3 (state); field N is fields[N - 3]
        return StatLine(pid=pid, state=fields[0], pgrp=int(fields[2]), start_time=int(fields[19]))
    except ValueError:
        return None


def parse_stats(text: str) -> list[StatLine]:
    """Every parseable stat line of a concatenation (`cat /proc/[0-9]*/stat`)."""
    return [line for line in map(parse_stat, text.splitlines()) if line is not None]


def decode_nul_list(raw: bytes) -> tuple[str, ...]:
    """/proc/PID/cmdline: NUL-separated args. Non-UTF-8 bytes survive as surrogates (os.fsdecode style)."""
    if not raw:
        return ()
    return tuple(p.decode("utf-8", "surrogateescape") for p in raw.removesuffix(b"\0").split(b"\0"))


def decode_environ(raw: bytes) -> dict[str, str]:
    """/proc/PID/environ: NUL-separated NAME=value entries."""
    env: dict[str, str] = {}
    for entry in decode_nul_list(raw):
        name, sep, value = entry.partition("=")
        if sep:
            env[name] = value
    return env


def _b64(line: str) -> bytes:
    try:
        return base64.b64decode(line.strip(), validate=True)
    except binascii.Error:
        return b""


def proc_info_from_dump(pid: int, dump: str, start_time: int | None) -> ProcInfo:
    """Build a ProcInfo from INSPECT_SH output: base64 lines of stat, cmdline, environ, stat again.

    GONE when the PID does not exist, when it now names another process (start time differs from the one
    asked), or when it vanished or changed hands between the two stat reads.
    """
    lines = [*dump.splitlines(), "", "", "", ""][:4]
    first = parse_stat(_b64(lines[0]).decode("utf-8", "replace"))
    again = parse_stat(_b64(lines[3]).decode("utf-8", "replace"))
    if first is None or again is None or again.start_time != first.start_time:
        return ProcInfo(pid=pid, state=ProcState.GONE, start_time=start_time or 0)
    if start_time is not None and first.start_time != start_time:
        return ProcInfo(pid=pid, state=ProcState.GONE, start_time=first.start_time)
    dead = first.is_dead or again.is_dead
    return ProcInfo(
        pid=pid,
        state=ProcState.ZOMBIE if dead else ProcState.RUNNING,
        start_time=first.start_time,
        argv=decode_nul_list(_b64(lines[1])),
        environ=decode_environ(_b64(lines[2])),
    )
