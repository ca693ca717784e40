"""`up` proves that the process answering on an instance's port is the one it started, over REAL sshd.

Three ways another process ends up answering, with `fleetgen.sim` as the engine:
- two instances of the fleet on one port (two [[hosts]] entries for one machine, one base_port): `up` runs
  `plan`'s cross-instance rules first and starts nothing (it used to start both and print "2/2 ready");
- a foreign process takes the port between `up`'s port check and the engine's bind: the health check is
  answered (here by a byte-for-byte TCP relay in this test process to a real, identical sim), but the
  listening socket's holder (/proc/net/tcp inode → /proc/PID/fd) is not the started process: not ready, the
  holder is named (pid, argv), the started process is stopped;
- a foreign process holds the port before `up`: refused before launch, naming its pid and argv.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.config import load_fleet
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.deploy.listener import port_owners, stranger_problem
from fleetgen.deploy.readiness import Readiness
from fleetgen.errors import LaunchFailed, PlanError, VerifyError
from fleetgen.fleet.status import fleet_status
from fleetgen.remote import open_host
from tests.fixtures.ports import free_ports
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.support import write_fleet
from tests.integration.deploy.test_sglang import QWEN36, sim_fleet


def _is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in "ZX"
    except OSError:
        return False


async def test_two_instances_on_one_port_are_refused_before_anything_starts(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    a, b = (dataclasses.replace(ssh_hosts[0], name=n) for n in ("a", "b"))  # one machine, two entries
    [port] = free_ports(1)
    fleet = write_fleet(
        tmp_path / "fleet.toml",
        [a, b],
        kind="sglang",
        python=sys.executable,
        model=str(QWEN36),
        workdir_tag=tmp_path.name,
        launcher=["-m", "fleetgen.sim"],
        base_ports=[port, port],
    )
    assert [i.port for i in load_fleet(fleet).instances()] == [port, port]
    try:
        with pytest.raises(PlanError) as caught:
            await up(Fleet.load(fleet))
        assert f"[port-clash] b-0 and a-0 both listen on port {port} of 127.0.0.1:" in caught.value.message
        assert "[gpu-shared] b-0 and a-0 both use GPU 0" in caught.value.message
        assert "distinct base_port" in caught.value.fix and "its own gpus list" in caught.value.fix
        assert not list((ssh_hosts[0].workdir / tmp_path.name).glob("*/launch.sh"))  # nothing launched
    finally:
        await down(Fleet.load(fleet))


async def test_port_taken_by_another_process_after_the_check_is_not_ready(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    winner_dir = tmp_path / "winner"
    winner_dir.mkdir()
    winner = sim_fleet(winner_dir, ssh_hosts[:1], model=QWEN36)
    ours = sim_fleet(tmp_path, ssh_hosts[:1], model=QWEN36, args={"sim-start-delay": 600.0})
    [inst] = load_fleet(ours).instances()
    [winner_inst] = load_fleet(winner).instances()
    relays: list[asyncio.Server] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        to_reader, to_writer = await asyncio.open_connection("127.0.0.1", winner_inst.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, to_writer), pipe(to_reader, writer))

    def take_port(instance: str, message: str) -> None:
        """On "spawned": this process listens on the instance's port before the engine binds it."""
        if instance == inst.name and message.startswith("spawned") and not relays:
            sock = socket.socket()
            sock.bind(("127.0.0.1", inst.port))
            sock.listen()
            task = asyncio.get_running_loop().create_task(asyncio.start_server(relay, sock=sock))
            task.add_done_callback(lambda t: relays.append(t.result()))

    try:
        [first] = await up(Fleet.load(winner))
        assert first.error is None, first.error
        [out] = await up(Fleet.load(ours), progress=take_port)
        assert relays, "the port was never taken"
        assert isinstance(out.error, VerifyError)
        message = " ".join(out.error.message.split())
        assert f"the process fleetgen started (pid {out.pid}) does not listen on port {inst.port}" in message
        # the holder: this test process, named by its command line (pytest's, or an xdist worker's)
        assert f"pid {os.getpid()} ({sys.orig_argv[0]} " in message
        assert "give this instance a free port" in out.error.fix
        assert out.pid is not None and not _is_running(out.pid)  # the started process was stopped

        # Started again by hand (same script) while the port is still taken: `status` must not say ready.
        root = ssh_hosts[0].workdir / tmp_path.name / inst.name
        async with open_host(load_fleet(ours).host("h0")) as remote:
            again = await remote.spawn(
                str(root / "launch.sh"), str(root / "logs" / "hand.log"), str(root / "pid"), cwd=str(root)
            )
        [st] = await fleet_status(Fleet.load(ours), rate_window_s=0)
        assert st.pid == again.pid and st.drift == [] and st.readiness is not Readiness.READY
        assert f"pid {again.pid}) does not listen on port {inst.port}; it is held by pid {os.getpid()}" in (
            " ".join(st.problem.split())
        )
    finally:
        for server in relays:
            server.close()
        await down(Fleet.load(ours))
        await down(Fleet.load(winner))


async def test_port_held_before_up_names_the_holder(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])
    [inst] = load_fleet(fleet).instances()
    code = "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
    code += "print('listening', flush=True); sys.stdin.read()"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(inst.port), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and await holder.stdout.readline() == b"listening\n"
        [out] = await up(Fleet.load(fleet))
        assert isinstance(out.error, LaunchFailed) and out.pid is None
        assert f"port {inst.port} on h0 is already in use by pid {holder.pid} (" in out.error.message
        assert "s.bind(" in out.error.message and "127.0.0.1" in out.error.message
    finally:
        holder.kill()
        await holder.wait()
        await down(Fleet.load(fleet))


@pytest.mark.parametrize("depth", [1, 2], ids=["child", "grandchild"])
async def test_a_descendant_holding_the_socket_counts_as_the_started_process(
    ssh_hosts: list[SshdHost], tmp_path: Path, depth: int
) -> None:
    """An engine may serve HTTP from a child, or a child of a child (a launcher that starts a server that
    forks its HTTP worker); the started process's /proc/PID/stat `comm` may hold `) ` and spaces."""
    weird = tmp_path / "x) S 1 (y"  # a comm that fools a naive split of /proc/PID/stat
    weird.symlink_to(sys.executable)
    child = "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    child += "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    parent = child
    for _ in range(depth):
        parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {parent!r}])"
    proc = await asyncio.create_subprocess_exec(
        str(weird), "-c", parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        port = int(await proc.stdout.readline())
        async with open_host(ssh_hosts[0].entry()) as host:
            owners = await port_owners(host, port)
        [listener] = owners.listeners
        [holder] = listener.holders
        ancestor = holder
        for _ in range(depth):
            ancestor = owners.parents[ancestor]
        assert ancestor == proc.pid  # the holder is the started process's child (or grandchild)
        assert stranger_problem(owners, proc.pid, "127.0.0.1") == ""
        other = stranger_problem(owners, holder + 10**6, "127.0.0.1")  # a PID that is not its ancestor
        assert f"held by pid {holder} (" in other and "s.getsockname()" in other
        assert stranger_problem(owners, proc.pid, "10.1.2.3") == (
            f"the process fleetgen started (pid {proc.pid}) does not listen on port {port}; "
            "nothing listens there now"
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the parent and its child
        await proc.wait()
