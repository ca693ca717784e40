"""Connections that close or drop, against real sshd: detached processes outlive them, calls reconnect,
in-flight calls fail with ConnectionLost (never hang), and port forwards come back on the same local port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from fleetgen.errors import ConnectionLost
from fleetgen.remote import ProcState, SshHost
from tests.fixtures.ports import free_port
from tests.fixtures.sshd import SshdHost


async def test_spawned_process_survives_its_connection_and_is_found_again(
    sshd_factory: Callable[[str], SshdHost], tmp_path: Path
) -> None:
    server = sshd_factory("spawn")  # its own: dropping a session host's connections cuts other tests'
    entry = server.entry()
    script, log, pidfile = tmp_path / "svc.sh", tmp_path / "svc-1.log", tmp_path / "svc.pid"
    async with SshHost(entry) as first:
        await first.put(str(script), b"#!/bin/sh\necho up $$\nexec sleep 600\n", 0o755)
        spawned = await first.spawn(str(script), str(log), str(pidfile), cwd=str(tmp_path))
    server.drop_connections()  # and the sshd session process is gone too

    async with SshHost(entry) as second:
        pid = int((await second.read(str(pidfile))).decode())
        assert pid == spawned.pid
        info = await second.inspect(pid, spawned.start_time)
        assert info.state is ProcState.RUNNING and info.argv == ("sleep", "600")
        assert (await second.tail(str(log), 5)).startswith(f"up {pid}")
        await second.stop(pid, start_time=spawned.start_time, timeout=10)
        assert (await second.inspect(pid, spawned.start_time)).state in (ProcState.GONE, ProcState.ZOMBIE)


async def test_dropped_connection_reconnects_on_the_next_call(
    sshd_factory: Callable[[str], SshdHost],
) -> None:
    server = sshd_factory("drop")
    async with SshHost(server.entry()) as host:
        assert (await host.run(["echo", "1"])).stdout == "1\n"
        first_sessions = server.session_pids()
        assert server.drop_connections() == 1
        assert (await host.run(["echo", "2"])).stdout == "2\n"
        assert server.session_pids() and server.session_pids() != first_sessions  # a new connection


async def test_in_flight_call_fails_with_connection_lost_then_recovers(
    sshd_factory: Callable[[str], SshdHost], tmp_path: Path
) -> None:
    server = sshd_factory("inflight")
    async with SshHost(server.entry()) as host:
        marker = tmp_path / "started"
        call = asyncio.ensure_future(
            host.run(["sh", "-c", f"echo $$ > {marker}.tmp; mv {marker}.tmp {marker}; sleep 60"])
        )
        for _ in range(400):  # wait until the command runs on the host, then cut the connection under it
            if marker.exists():
                break
            await asyncio.sleep(0.05)
        server.drop_connections()
        with pytest.raises(ConnectionLost) as caught:
            await asyncio.wait_for(call, 60)
        assert "dropped while running `sh`" in caught.value.message and "reconnects" in caught.value.fix
        assert (await host.run(["echo", "back"])).stdout == "back\n"
        # Without a pty, sshd leaves the orphaned command running (as OpenSSH does): stop it by its PID.
        await host.stop(int(marker.read_text()), timeout=10)


async def test_restarted_sshd_is_reconnected(sshd_factory: Callable[[str], SshdHost]) -> None:
    server = sshd_factory("restart")
    async with SshHost(server.entry()) as host:
        await host.run(["true"])
        server.restart()  # same port, same host key
        assert (await host.run(["echo", "again"])).stdout == "again\n"
        await host.put(str(server.workdir / "after.txt"), b"after restart")  # SFTP reopens too
        assert (server.workdir / "after.txt").read_bytes() == b"after restart"


async def test_forward_reaches_a_remote_http_server_and_survives_a_drop(
    sshd_factory: Callable[[str], SshdHost], tmp_path: Path
) -> None:
    server = sshd_factory("fwd")
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("hello through the tunnel")
    remote_port = free_port()
    script = f"#!/bin/sh\nexec python3 -m http.server {remote_port} --bind 127.0.0.1 --directory {site}\n"
    async with SshHost(server.entry()) as host:
        await host.put(str(tmp_path / "http.sh"), script.encode(), 0o755)
        spawned = await host.spawn(
            str(tmp_path / "http.sh"),
            str(tmp_path / "http.log"),
            str(tmp_path / "http.pid"),
            cwd=str(tmp_path),
        )
        try:
            local_port = await host.forward(remote_port)
            assert local_port != remote_port
            assert await host.forward(remote_port) == local_port  # one forward per remote port
            assert (
                await _fetch_until_ok(f"http://127.0.0.1:{local_port}/hello.txt")
                == "hello through the tunnel"
            )

            server.drop_connections()  # the Host re-opens the forward on the same local port by itself
            assert (
                await _fetch_until_ok(f"http://127.0.0.1:{local_port}/hello.txt")
                == "hello through the tunnel"
            )
        finally:
            await host.stop(spawned.pid, start_time=spawned.start_time, timeout=10)


async def _fetch_until_ok(url: str, attempts: int = 100) -> str:
    """GET url, retrying while the server (or the re-opened forward) is not there yet.

    A new TCP connection per attempt: one kept alive from before a drop rode the old SSH channel."""
    last: BaseException | None = None
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:
        for _ in range(attempts):
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return await response.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = exc
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered 200: {last!r}")
