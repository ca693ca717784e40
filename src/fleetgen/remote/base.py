"""The narrow interface to a machine: `Host`, with `LocalHost` and `SshHost` behind it.

Commands are argv lists, never shell strings built by concatenation. Every remote change is read back:
`put` verifies a sha256 computed on the target; `spawn` returns the PID *and* its start time so a later
`inspect` can tell the same process from a reused PID.

A subclass supplies the transport (`_exec`, `_stream_lines`, `forward`; `_open`, `_shutdown` and a faster
`read` / `_write_temp` / `_makedirs` where it has them); `Host` turns it into verified puts, detached
spawns, /proc inspection and group stops, so every kind of host behaves the same, down to the error messages.

The errors every host shares are built here (`timed_out`, `unreadable`, `command_error`, `cannot_write`, …).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import secrets
import shlex
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Self

from fleetgen.errors import CommandError, RemoteError, TransferError, tail
from fleetgen.remote import scripts
from fleetgen.remote.procfs import ProcInfo as ProcInfo  # re-exported: what `inspect` returns
from fleetgen.remote.procfs import ProcState as ProcState
from fleetgen.remote.procfs import StatLine, parse_stat, parse_stats, proc_info_from_dump

DEFAULT_TIMEOUT_S = 600.0  # every command has a deadline: a hung host must surface as an error, not a hang
_STOP_POLL_S = 0.2
_KILL_GRACE_S = 10.0
# every process whose environment holds the assignment $1, as /proc/PID/stat lines
_MARKED_SH = r"""
for f in $(grep -lsxzF -e "$1" /proc/[0-9]*/environ); do
  cat "${f%/environ}/stat" 2>/dev/null
done
exit 0
"""
Output = tuple[int, bytes, bytes]  # a finished command: exit status, stdout, stderr


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


class HostState(enum.Enum):
    """Lifecycle of a Host: NEW → OPEN → CLOSED; a CLOSED host refuses every call."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class Host(ABC):
    """One machine fleetgen acts on. An async context manager; refuses use after close."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = HostState.NEW
        # Things the user must see (e.g. host key checking off). The library never prints: callers show them.
        self.warnings: list[str] = []
        self._home: str | None = None

    # ---- transport primitives -------------------------------------------------------------------------
    @abstractmethod
    async def _exec(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> Output:
        """Run argv → (exit status, stdout, stderr); ConnectionLost / CommandError on transport trouble."""

    async def _write_temp(self, path: str, data: bytes, mode: int) -> None:
        """Create `path` (new), write `data`, fsync, set `mode`: through stdin (a transport may do better)."""
        result = await self.run(scripts.sh(scripts.WRITE_SH, path, f"{mode:o}"), check=False, stdin=data)
        if result.exit_status != 0:
            raise self.cannot_write(path, result.stderr.strip() or f"exit {result.exit_status}")

    @abstractmethod
    def _stream_lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        """Run argv and yield its stdout lines as they come; stop the command when the iterator closes."""

    async def _open(self) -> None:
        return None  # a transport that connects overrides it, as one that holds resources `_shutdown`

    async def _shutdown(self) -> None:
        return None

    @abstractmethod
    async def forward(self, remote_port: int) -> int: ...

    # ---- lifecycle -------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.state is HostState.CLOSED:
            raise RemoteError(
                f"host {self.name} was closed and cannot be used again",
                fix="open a new Host (open_host(entry)) for further work",
            )

    async def __aenter__(self) -> Self:
        self._check_usable()
        await self._open()
        self.state = HostState.OPEN
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the host (connections, forwards); idempotent. Detached processes keep running."""
        if self.state is not HostState.CLOSED:
            self.state = HostState.CLOSED
            await self._shutdown()

    # ---- commands --------------------------------------------------------------------------------------
    async def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        stdin: bytes | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (the Host's public parameter name)
    ) -> RunResult:
        """Run argv (no shell parsing of the values); non-zero exit with `check` raises CommandError."""
        self._check_usable()
        argv = tuple(argv)
        if not argv:
            raise ValueError("run() needs a program to run: argv is empty")
        status, out, err = await self._exec(argv, stdin, timeout)
        result = RunResult(
            argv=argv,
            exit_status=status,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
        )
        if check and status != 0:
            raise self.command_error(result)
        return result

    def timed_out(self, argv: Sequence[str], timeout_s: float) -> CommandError:
        """A command that outlived its deadline (the transport has stopped it)."""
        return CommandError(
            f"`{argv[0]}` did not finish within {timeout_s:g}s on {self.name}",
            fix="pass a longer timeout, or check why it hangs (is the host overloaded?)",
            context={"host": self.name, "argv": _show_argv(argv)[:500]},
        )

    def unreadable(self, path: str, why: str) -> RemoteError:
        return RemoteError(
            f"cannot read {path} on {self.name}: {why}",
            fix="check the path and its permissions",
            context={"host": self.name},
        )

    def command_error(self, result: RunResult, message: str = "", fix: str = "") -> CommandError:
        """A CommandError with host, argv, exit code and stderr tail; default cause/fix by exit code."""
        program = result.argv[0]
        if not message and result.exit_status == 127:
            message = f"`{program}` was not found on {self.name}"
            fix = fix or f"install `{program}` on {self.name}, or give its full path (check: which {program})"
        elif not message and result.exit_status == 126:
            message = f"`{program}` is not executable on {self.name}"
            fix = fix or f"chmod +x {program} on {self.name}, or run it through its interpreter"
        message = message or f"`{program}` failed on {self.name} with exit code {result.exit_status}"
        fix = fix or "read the stderr above; run the same argv by hand on the host to see the whole output"
        context = {
            "host": self.name,
            "argv": _show_argv(result.argv),
            "exit code": result.exit_status,
            "stderr": tail(result.stderr, 15),
        }
        return CommandError(message, fix=fix, context=context)

    async def home(self) -> str:
        """The login user's home folder on the host (cached per connection)."""
        if self._home is None:
            result = await self.run(["sh", "-c", 'printf %s "$HOME"'])
            self._home = result.stdout or "/"
        return self._home

    async def expand(self, path: str) -> str:
        """`~` and `~/x` → absolute path on the host (argv values are quoted, so no shell expands them)."""
        if path == "~" or path.startswith("~/"):
            return (await self.home()).rstrip("/") + path[1:] or "/"
        return path

    async def read(self, path: str) -> bytes:
        """A file's bytes."""
        self._check_usable()
        target = await self.expand(path)
        status, out, err = await self._exec(["cat", "--", target], None, DEFAULT_TIMEOUT_S)
        if status != 0:
            raise self.unreadable(target, err.decode(errors="replace").strip() or f"exit {status}")
        return out

    async def exists(self, path: str) -> bool:
        result = await self.run(["test", "-e", await self.expand(path)], check=False)
        return result.exit_status == 0

    async def _makedirs(self, folder: str) -> None:
        """`mkdir -p folder` (expanded) on the host; a subclass may skip the shell."""
        made = await self.run(["mkdir", "-p", "--", folder], check=False)
        if made.exit_status != 0:
            raise self.cannot_mkdir(folder, made.stderr.strip() or f"exit {made.exit_status}")

    def cannot_mkdir(self, folder: str, cause: str) -> RemoteError:
        return RemoteError(
            f"cannot create folder {folder} on {self.name}: {cause}",
            fix=f"check that {self.name}'s user may write there (and that no file has that name), "
            "or choose another path",
            context={"host": self.name},
        )

    def cannot_write(self, path: str, cause: str) -> TransferError:
        return TransferError(
            f"cannot write {path} on {self.name}: {cause}",
            fix=f"check that the folder is writable and the disk not full on {self.name}",
            context={"host": self.name, "path": path},
        )

    # ---- verified put ----------------------------------------------------------------------------------
    async def put(self, path: str, data: bytes, mode: int = 0o644) -> str:
        """Write `data` to `path` atomically and verified; returns its sha256 (as computed on the host).

        Temp file in the target folder (same filesystem → rename is atomic) → fsync → sha256 ON THE HOST,
        compared → rename over the target → sha256 of the target, compared again.
        """
        self._check_usable()
        dest = await self.expand(path)
        folder = str(PurePosixPath(dest).parent)
        await self._makedirs(folder)
        tmp = f"{folder}/.{PurePosixPath(dest).name}.{secrets.token_hex(6)}.fleetgen-tmp"
        want = hashlib.sha256(data).hexdigest()
        await self._write_temp(tmp, data, mode)
        checked = await self.run(scripts.sh(scripts.VERIFY_RENAME_SH, tmp, dest, want), check=False)
        if checked.exit_status == scripts.EXIT_HASH_MISMATCH:
            raise TransferError(
                f"upload of {dest} to {self.name} arrived corrupted (sha256 differs)",
                fix="retry; if it repeats, check the host's disk (dmesg, df)",
                context={"host": self.name, "path": dest, "stderr": checked.stderr.strip()},
            )
        if checked.exit_status != 0:
            raise self.command_error(
                checked,
                f"cannot move the upload into place at {dest} on {self.name}",
                f"check permissions of {folder} and free disk on {self.name}",
            )
        hashes = checked.stdout.split()
        if hashes != [want, want]:
            raise TransferError(
                f"{dest} on {self.name} does not read back as written (sha256 differs)",
                fix="retry; if it repeats, another process may be writing the same path",
                context={"host": self.name, "path": dest, "expected": want, "read back": " ".join(hashes)},
            )
        return want

    # ---- processes -------------------------------------------------------------------------------------
    async def spawn(self, script: str, log_path: str, pidfile: str, *, cwd: str | None = None) -> Spawned:
        """Start `script` detached (setsid, nohup, stdin /dev/null) logging to a NEW `log_path`.

        Returns PID and start time; the pidfile is written atomically. The process survives this
        connection closing. Env belongs inside the script (`export`): SSH env requests are dropped.
        """
        self._check_usable()
        folder = await self.expand(cwd or "~")
        paths = [await self.expand(p) for p in (script, log_path, pidfile)]
        result = await self.run(scripts.sh(scripts.SPAWN_SH, folder, *paths), check=False)
        if result.exit_status != 0:
            raise self._spawn_error(result, folder, paths[0], paths[1])
        lines = result.stdout.splitlines()
        stat = parse_stat(lines[1]) if len(lines) > 1 else None
        if stat is None:
            raise RemoteError(
                f"{paths[0]} started on {self.name} but its /proc entry could not be read",
                fix=f"read its log: {paths[1]}",
                context={"host": self.name, "stdout": result.stdout},
            )
        return Spawned(pid=stat.pid, start_time=stat.start_time, log_path=paths[1])

    def _spawn_error(self, result: RunResult, folder: str, script: str, log: str) -> CommandError:
        fixes = {
            scripts.EXIT_NO_FOLDER: f"create {folder} on {self.name} (or fix the host's workdir)",
            scripts.EXIT_NO_SCRIPT: f"put the launch script at {script} first",
            scripts.EXIT_NOT_EXECUTABLE: f"put {script} with mode 0o755",
            scripts.EXIT_LOG_EXISTS: "use a new log file name per launch (e.g. with a timestamp)",
        }
        cause = result.stderr.strip().rpartition("\n")[2] or "spawn failed"  # stderr's last line
        fix = fixes.get(result.exit_status, f"check {folder} and {log} on {self.name}")
        return self.command_error(result, f"cannot start {script} on {self.name}: {cause}", fix)

    async def inspect(self, pid: int, start_time: int | None = None) -> ProcInfo:
        """State, argv, environ, start time from /proc. GONE if absent or the start time differs (PID reuse);
        ZOMBIE for Z/X states (`kill -0` would still succeed on those)."""
        self._check_usable()
        result = await self.run(scripts.sh(scripts.INSPECT_SH, str(pid)))
        return proc_info_from_dump(pid, result.stdout, start_time)

    async def stop(self, pid: int, *, start_time: int | None = None, timeout: float = 30.0) -> list[int]:  # noqa: ASYNC109 (the Host's public parameter name)
        """SIGTERM the process group (or the PID if it leads none), wait, SIGKILL, confirm nothing lives;
        returns the PIDs that were alive (what was swept).

        A PID whose start time differs from `start_time` belongs to another process now: never signalled.
        A group whose leader is gone is still swept (helpers reparented to init, e.g. vLLM's after Slurm
        ended its job): Linux reuses no PID while a live group bears its number.
        """
        self._check_usable()
        stats = await self._stats()
        me = next((s for s in stats if s.pid == pid), None)
        if me is not None and start_time is not None and me.start_time != start_time:
            return []
        leads_group = me is None or me.pgrp == pid
        target = f"-{pid}" if leads_group else str(pid)
        alive = _alive(stats, pid, leads_group)
        loop = asyncio.get_running_loop()
        for signal_name, wait_s in (("TERM", timeout), ("KILL", _KILL_GRACE_S)):
            if not _alive(stats, pid, leads_group):
                return alive
            stats = await self._stats(signal_name, target)
            deadline = loop.time() + wait_s
            while _alive(stats, pid, leads_group) and loop.time() < deadline:
                await asyncio.sleep(_STOP_POLL_S)
                stats = await self._stats()
        if _alive(stats, pid, leads_group):
            raise RemoteError(
                f"process {pid} on {self.name} survived SIGTERM and SIGKILL",
                fix=f"look at it on the host: ps -o pid,stat,cmd -g {pid}; it may be stuck in the kernel "
                "(state D, e.g. a hung GPU driver call) and need a reboot",
                context={"host": self.name, "pid": pid},
            )
        return alive

    async def marked_processes(self, variable: str, value: str) -> list[StatLine]:
        """The live processes whose environment holds `variable=value` (a Slurm job's, a Ray actor's
        launch), whatever became of their parent and their process group (as far as this user may read
        their environment)."""
        result = await self.run(scripts.sh(_MARKED_SH, f"{variable}={value}"), check=False, timeout=60.0)
        return [s for s in parse_stats(result.stdout) if not s.is_dead]

    async def _stats(self, signal_name: str = "", target: str = "") -> list[StatLine]:
        result = await self.run(scripts.sh(scripts.SIGNAL_AND_STATS_SH, signal_name, target))
        return parse_stats(result.stdout)

    # ---- logs ------------------------------------------------------------------------------------------
    async def tail(self, path: str, num_lines: int = 100) -> str:
        """The last `num_lines` lines of a file on the host."""
        target = await self.expand(path)
        result = await self.run(["tail", "-n", str(num_lines), "--", target], check=False)
        if result.exit_status != 0:
            raise self.command_error(
                result,
                f"cannot read {target} on {self.name}",
                "check the path (fleetgen status shows each instance's log)",
            )
        return result.stdout

    async def follow(self, path: str, *, poll_s: float = 0.2, last: int = 0) -> AsyncIterator[str]:
        """Yield the last `last` lines of `path`, then the lines appended.

        Follows the name (`tail -F`), so a log that is recreated keeps being followed. The lines already
        there come from the same `tail` as the new ones, so no line written in between is lost.
        """
        self._check_usable()
        target = await self.expand(path)
        argv = ["tail", "-F", "-s", str(poll_s), "-n", str(max(0, last)), "--", target]
        async for line in self._stream_lines(argv):
            yield line


def _alive(stats: list[StatLine], pid: int, leads_group: bool) -> list[int]:
    """Live PIDs of the group (the engine's workers share it and hold GPU memory: all must go), else the PID;
    zombies do not count: they hold nothing."""
    return [s.pid for s in stats if (s.pgrp if leads_group else s.pid) == pid and not s.is_dead]


def _show_argv(argv: Sequence[str]) -> str:
    """argv for error context; the body of an `sh -c` snippet is elided (it is fleetgen's own constant)."""
    shown = list(argv)
    if len(shown) > 2 and shown[:2] == ["sh", "-c"] and "\n" in shown[2]:
        shown[2] = "<fleetgen snippet>"
    return shlex.join(shown)
