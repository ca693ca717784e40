"""`LocalHost`: this machine, through asyncio subprocesses (`ssh = "local"` in the fleet file)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from fleetgen.remote.base import Host, Output


class LocalHost(Host):
    """The local machine as a Host. Same commands and snippets as over SSH, minus the network."""

    async def _exec(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> Output:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError as exc:
            # Same status a shell gives, so the caller sees one "not found" error for both kinds of host.
            return 127, b"", f"{argv[0]}: not found ({exc.strerror})".encode()
        except PermissionError as exc:
            return 126, b"", f"{argv[0]}: {exc.strerror}".encode()
        # Not wait_for: on Python 3.11 it loses a cancel that lands as the command ends (a probe loops on).
        try:
            async with asyncio.timeout(timeout_s):
                out, err = await proc.communicate(stdin)
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise self.timed_out(argv, timeout_s) from exc
        assert proc.returncode is not None  # communicate() returned, so the process was reaped
        # Killed by a signal: asyncio says -n, a shell (and SshHost) 128+n.
        return (proc.returncode if proc.returncode >= 0 else 128 - proc.returncode), out, err

    async def _stream_lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert proc.stdout is not None  # PIPE was asked for
        try:
            async for raw in proc.stdout:
                yield raw.decode("utf-8", "replace").rstrip("\n")
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def forward(self, remote_port: int) -> int:
        """The host is this machine: its 127.0.0.1:port is already reachable."""
        self._check_usable()
        return remote_port
