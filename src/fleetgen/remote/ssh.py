"""`SshHost`: a machine reached over SSH (asyncssh): exec, SFTP, local port forwards, reconnects.

One connection per Host, opened on `__aenter__` (or first use). When it drops, calls in flight fail with
ConnectionLost (never hang: keepalives, timeouts) and the next call reconnects with backoff; forwards are
re-opened on the same local ports, at once if the Host holds any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fleetgen.config import HostEntry
from fleetgen.errors import ConnectError, ConnectionLost, FleetgenError, RemoteError
from fleetgen.remote import scripts, sshconnect
from fleetgen.remote.base import Host, HostState, Output
from fleetgen.remote.sshlib import asyncssh

log = logging.getLogger("fleetgen.remote")

RECONNECT_ATTEMPTS = 4
RECONNECT_BACKOFF_S = 0.5  # doubled after each failed attempt: 0.5, 1, 2 s
# Errors meaning "the transport is gone", as opposed to "the command failed".
_TRANSPORT_ERRORS = (asyncssh.DisconnectError, asyncssh.ChannelOpenError, BrokenPipeError, ConnectionError)
# Runs argv with the channel's stdin held open; when the channel closes, `cat` sees EOF and the command
# is killed, so a follower (`tail -F`) does not outlive the caller on the host.
_TIED_TO_CHANNEL_SH = '"$@" & p=$!; cat > /dev/null; kill "$p" 2>/dev/null; exit 0'


class SshHost(Host):
    """A Host over SSH. Use as `async with SshHost(entry) as host:`; refuses use after close."""

    def __init__(self, entry: HostEntry) -> None:
        super().__init__(entry.name)
        self.entry = entry
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._lock = asyncio.Lock()
        self._has_connected = False
        self._forwards: dict[int, int] = {}  # remote port → local port, kept across reconnects
        self._listeners: list[asyncssh.SSHListener] = []
        self._watcher: asyncio.Task[None] | None = None

    # ---- connection ------------------------------------------------------------------------------------
    async def _open(self) -> None:
        await self._connection()

    async def _shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._forget_connection()

    async def _connection(self) -> asyncssh.SSHClientConnection:
        self._check_usable()
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        async with self._lock:  # one (re)connect at a time; the others wait and reuse it
            self._check_usable()
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            await self._forget_connection()
            conn = await self._connect()
            self._conn, self._has_connected, self._home = conn, True, None
            if self.state is HostState.NEW:
                self.state = HostState.OPEN
            for remote_port, local_port in self._forwards.items():  # the same local ports as before a drop
                await self._listen(conn, local_port, remote_port)
            if self._forwards:
                self._watch(conn)
            return conn

    async def _connect(self) -> asyncssh.SSHClientConnection:
        """One attempt the first time; after a drop RECONNECT_ATTEMPTS, the last one raising its error."""
        for attempt in range(1, RECONNECT_ATTEMPTS if self._has_connected else 1):
            try:
                return await sshconnect.connect(self.entry, self.warnings)
            except ConnectError:  # HostKeyError is not a ConnectError: a changed key is never retried
                delay = RECONNECT_BACKOFF_S * 2 ** (attempt - 1)
                log.info("reconnect to %s failed (attempt %d), retrying in %.1fs", self.name, attempt, delay)
                await asyncio.sleep(delay)
        return await sshconnect.connect(self.entry, self.warnings)

    async def _forget_connection(self) -> None:
        for listener in self._listeners:
            listener.close()
            with contextlib.suppress(*_TRANSPORT_ERRORS, OSError):
                await listener.wait_closed()
        self._listeners.clear()
        if self._sftp is not None:
            self._sftp.exit()
            self._sftp = None
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(*_TRANSPORT_ERRORS, OSError):
                await self._conn.wait_closed()
            self._conn = None

    def _lost(self, argv: Sequence[str], exc: BaseException | None) -> ConnectionLost:
        if self._conn is not None:
            self._conn.abort()  # let the next call start from a fresh connection
        what = f"running `{argv[0]}`" if argv else "transferring a file"
        reason = getattr(exc, "reason", None) or (str(exc) if exc else "channel closed without exit status")
        return ConnectionLost(
            f"the SSH connection to {self.name} dropped while {what}: {reason}",
            fix="run the command again (fleetgen reconnects on the next call); if it keeps dropping, "
            "check the network and the host's sshd (journalctl -u ssh)",
            context={"host": self.name, "ssh": sshconnect.where(self.entry)},
        )

    # ---- commands --------------------------------------------------------------------------------------
    async def _exec(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> Output:
        command = shlex.join(argv)  # the remote login shell parses this: every value is quoted
        stdin_mode = asyncssh.DEVNULL if stdin is None else asyncssh.PIPE
        process = await self._start(argv, command, input=stdin, encoding=None, stdin=stdin_mode)
        try:
            done = await process.wait(check=False, timeout=timeout_s)
        except asyncssh.TimeoutError as exc:
            process.close()
            raise self.timed_out(argv, timeout_s) from exc
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(argv, exc) from exc
        status = done.exit_status  # -1 when the host sent an exit signal instead (SSH sends one or the other)
        if done.exit_signal:  # killed by a signal on the host: report it like a shell would (128+n)
            status = 128 + int(signal.Signals.__members__.get(f"SIG{done.exit_signal[0]}", 0))
        if status is None or status < 0:
            raise self._lost(argv, None)
        return status, _bytes(done.stdout), _bytes(done.stderr)

    async def _start(
        self, argv: Sequence[str], command: str, **options: Any
    ) -> asyncssh.SSHClientProcess[Any]:
        """Open a session channel running `command`.

        A drop noticed only now (the peer's FIN not yet read) makes the channel open fail: the command never
        started, so the open is retried once on a fresh connection instead of failing the caller.
        """
        for is_retry in (False, True):
            conn = await self._connection()
            try:
                process: asyncssh.SSHClientProcess[Any] = await conn.create_process(command, **options)
                return process
            except _TRANSPORT_ERRORS as exc:
                if is_retry or not isinstance(exc, asyncssh.ChannelOpenError):
                    raise self._lost(argv, exc) from exc  # aborts the connection
                conn.abort()
        raise AssertionError("unreachable: the retry returns or raises")

    async def _stream_lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        command = shlex.join(scripts.sh(_TIED_TO_CHANNEL_SH, *argv))
        process = await self._start(argv, command, encoding="utf-8", errors="replace")
        try:
            async for line in process.stdout:
                yield line.rstrip("\n")
        except _TRANSPORT_ERRORS as exc:
            raise self._lost(argv, exc) from exc
        finally:
            process.close()

    # ---- files -----------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _sftp_doing(self, failed: Callable[[str], FleetgenError]) -> AsyncIterator[asyncssh.SFTPClient]:
        """The connection's SFTP client (started on first use) for one call: an SFTP error becomes
        `failed(reason)`, a drop ConnectionLost."""
        conn = await self._connection()
        if self._sftp is None:
            try:
                self._sftp = await conn.start_sftp_client()
            except _TRANSPORT_ERRORS as exc:
                raise self._lost([], exc) from exc
            except asyncssh.SFTPError as exc:
                raise RemoteError(
                    f"{self.name} offers no SFTP: {exc.reason}",
                    fix="enable it in the host's sshd_config: Subsystem sftp internal-sftp",
                    context={"host": self.name},
                ) from exc
        try:
            yield self._sftp
        except asyncssh.SFTPError as exc:
            raise failed(str(exc.reason)) from exc
        except _TRANSPORT_ERRORS as exc:
            raise self._lost([], exc) from exc

    async def _makedirs(self, folder: str) -> None:
        # SFTP: no login shell to start, unlike `mkdir -p` over exec
        async with self._sftp_doing(lambda why: self.cannot_mkdir(folder, why)) as sftp:
            await sftp.makedirs(folder, exist_ok=True)

    async def _write_temp(self, path: str, data: bytes, mode: int) -> None:
        async with self._sftp_doing(lambda why: self.cannot_write(path, why)) as sftp:
            # "xb": O_EXCL, the temp name must be new; fsync before the hash so the rename publishes
            # bytes that are on disk, not only in the page cache.
            async with sftp.open(path, "xb", attrs=asyncssh.SFTPAttrs(permissions=mode)) as fh:
                await fh.write(data)
                await fh.fsync()
            await sftp.chmod(path, mode)  # the host's umask may have masked bits off at creation

    async def read(self, path: str) -> bytes:
        """Read a file over SFTP (not a /proc file: its stat size is 0, so it reads empty)."""
        target = await self.expand(path)
        async with (
            self._sftp_doing(lambda why: self.unreadable(target, why)) as sftp,
            sftp.open(target, "rb") as fh,
        ):
            data: bytes = await fh.read()
        return data

    # ---- forwards --------------------------------------------------------------------------------------
    async def forward(self, remote_port: int) -> int:
        """A local 127.0.0.1 port reaching the host's 127.0.0.1:remote_port while this Host lives."""
        conn = await self._connection()
        if remote_port not in self._forwards:
            self._forwards[remote_port] = await self._listen(conn, 0, remote_port)
            self._watch(conn)
        return self._forwards[remote_port]

    async def _listen(self, conn: asyncssh.SSHClientConnection, local_port: int, remote_port: int) -> int:
        try:
            listener = await conn.forward_local_port("127.0.0.1", local_port, "127.0.0.1", remote_port)
        except OSError as exc:
            raise RemoteError(
                f"cannot listen on 127.0.0.1:{local_port} to forward {self.name}:{remote_port}: "
                f"{exc.strerror}",
                fix="free that local port (another program took it) and retry",
                context={"host": self.name},
            ) from exc
        self._listeners.append(listener)
        return int(listener.get_port())

    def _watch(self, conn: asyncssh.SSHClientConnection) -> None:
        """Reconnect as soon as `conn` drops while forwards exist: users of a forward make no calls."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._rewatch(conn))

    async def _rewatch(self, conn: asyncssh.SSHClientConnection) -> None:
        while True:
            await conn.wait_closed()
            if self.state is HostState.CLOSED:
                return
            try:
                conn = await self._connection()
            except RemoteError as exc:  # not swallowed: recorded, and the next call raises it again
                self.warnings.append(f"forwards to {self.name} are down: {exc.message}")
                log.warning("forwards to %s are down: %s", self.name, exc.message)
                return


def _bytes(data: bytes | str | None) -> bytes:
    return data if isinstance(data, bytes) else (data or "").encode()
