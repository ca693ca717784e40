"""The narrow interface to a machine: `Host`, with `LocalHost` and `SshHost` behind it.

Commands are argv lists, never shell strings built by concatenation. Every remote change is read back:
`put` verifies a sha256 computed on the target; `spawn` returns the PID *and* its start time so a later
`inspect` can tell the same process from a reused PID.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class RunResult:
    """A finished command: its argv, exit status and decoded output."""

    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Spawned:
    """A process started detached: PID, start time (clock ticks since boot, /proc/PID/stat field 22), log."""

    pid: int
    start_time: int
    log_path: str


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


@runtime_checkable
class Host(Protocol):
    """One machine fleetgen acts on. An async context manager; refuses use after close."""

    name: str

    async def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        stdin: bytes | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the Host protocol's name)
    ) -> RunResult:
        """Run argv; non-zero exit with `check` raises CommandError (host, argv, code, stderr tail)."""
        ...

    async def put(self, path: str, data: bytes, mode: int = 0o644) -> str:
        """Write `data` to `path` atomically and verified (temp + fsync + remote sha256 + rename).

        Returns the sha256."""
        ...

    async def read(self, path: str, size: int | None = None) -> bytes:
        """Read a file (an explicit `size` for /proc files, whose stat size is 0)."""
        ...

    async def exists(self, path: str) -> bool: ...

    async def spawn(self, script: str, log_path: str, pidfile: str, *, cwd: str | None = None) -> Spawned:
        """Start `script` (a path on the host) detached: new session, stdin /dev/null, output to a NEW log
        file, pidfile written atomically. It survives the SSH connection closing."""
        ...

    async def inspect(self, pid: int, start_time: int | None = None) -> ProcInfo:
        """State, argv, environ and start time from /proc; GONE when the start time differs (PID reuse)."""
        ...

    async def stop(self, pid: int, *, start_time: int | None = None, timeout: float = 30.0) -> None:  # noqa: ASYNC109 (the Host protocol's name)
        """SIGTERM the process group, wait up to `timeout`, SIGKILL, confirm gone (zombies count as gone)."""
        ...

    async def forward(self, remote_port: int) -> int:
        """A local port that reaches the host's 127.0.0.1:remote_port for as long as this Host lives."""
        ...

    async def tail(self, path: str, num_lines: int = 100) -> str: ...

    def follow(self, path: str, *, poll_s: float = 0.2, last: int = 0) -> AsyncIterator[str]:
        """Yield the last `last` lines of `path`, then every line appended (one command: none lost)."""
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Host: ...

    async def __aexit__(self, *exc: object) -> None: ...
