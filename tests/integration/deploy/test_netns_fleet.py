"""A fleet whose hosts are separate network stacks: real sshd in network namespaces behind veth pairs.

With `ssh_hosts` every "host" shares this machine's loopback, so a server bound to 127.0.0.1 "on a host" is
reachable without SSH and a path that skipped the tunnel would pass. Here (tests/fixtures/netns.py) each host
is its own network namespace: its 127.0.0.1 is not ours, and the only way in is its sshd on 10.231.N.2:22.

SGLang cannot start without a GPU, so the engine is `fleetgen.sim` (engine.launcher = -m fleetgen.sim, the
project's own python, visible inside the namespaces since they share the filesystem). Everything else is
real: `fleetgen hosts check/up/status/run/down` as subprocesses, SSH, the launch script, /proc, the tunnels.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from fleetgen.config import load_fleet
from fleetgen.remote import open_host
from tests.fixtures.netns import NetnsHost
from tests.integration.deploy.support import ArgValue, write_fleet

FLEETGEN = str(Path(sys.executable).with_name("fleetgen"))
INSTANCES = {"ns0-0", "ns1-0"}
SIM_ARGS: dict[str, ArgValue] = {
    "reasoning-parser": "qwen3",
    "max-running-requests": 8,
    "sim-output-tokens": 16,
}
# Not a test threshold: a guard so a wedged CLI fails the test instead of hanging it.
CLI_TIMEOUT_S = 300.0


async def cli(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "COLUMNS": "250"}  # rich wraps at 80 columns when not on a terminal
    proc = await asyncio.create_subprocess_exec(
        FLEETGEN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def sim_fleet(
    tmp_path: Path, hosts: list[NetnsHost], engine_lines: str = "", ready_timeout_s: float = 120.0
) -> Path:
    """One fleetgen.sim instance per namespace host, run by the project's python; `engine_lines` go into
    [engine] (e.g. bind and api_key_env)."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    fleet = write_fleet(
        tmp_path / "fleet.toml",
        hosts,
        kind="sglang",
        python=sys.executable,
        model=str(model),
        workdir_tag=tmp_path.name,
        launcher=["-m", "fleetgen.sim"],
        ready_timeout_s=ready_timeout_s,
        args=SIM_ARGS,
    )
    fleet.write_text(fleet.read_text().replace("[engine.args]", engine_lines + "\n[engine.args]", 1))
    return fleet


def refused(address: str, port: int) -> bool:
    """True when address:port actively refuses a TCP connection (nothing listens there)."""
    try:
        socket.create_connection((address, port), timeout=10).close()
    except ConnectionRefusedError:
        return True
    return False


def net_inode(pid: int) -> int:
    """The network namespace a process lives in (the test hosts share this machine's /proc)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def state_records(fleet: Path) -> dict[str, dict[str, Any]]:
    """What `fleetgen up` recorded per instance (`.fleetgen/state.json` next to the fleet file)."""
    state = json.loads((fleet.parent / ".fleetgen" / "state.json").read_text())
    records: dict[str, dict[str, Any]] = state["instances"]
    return records


async def test_hosts_check_reaches_each_namespace_over_its_own_network(
    netns_hosts: list[NetnsHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, netns_hosts)
    code, out, err = await cli("hosts", "check", "-f", str(fleet), "--json")
    reports = json.loads(out)
    assert [r["host"] for r in reports] == ["ns0", "ns1"], err
    for report in reports:
        assert report["reachable"] is True and report["error"] is None, report
        assert report["python_ok"] is True and report["model_present"] is True, report
    assert code in (0, 1), err  # 1 only for engine problems (no SGLang in this venv), never a crash

    addresses = [h.address for h in netns_hosts]
    assert len(set(addresses)) == 2 and all(not a.startswith("127.") for a in addresses)
    # Each host is a different network stack: it sees its own veth address and not the other host's.
    for host, other in ((netns_hosts[0], netns_hosts[1]), (netns_hosts[1], netns_hosts[0])):
        async with open_host(host.entry()) as remote:
            seen = (await remote.run(["ip", "-o", "-4", "addr", "show"])).stdout
        assert f"inet {host.address}/30" in seen and "inet 127.0.0.1/8" in seen
        assert other.address not in seen and host.gateway not in seen


async def test_sim_fleet_is_reached_only_through_the_ssh_tunnels(
    netns_hosts: list[NetnsHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, netns_hosts)
    records: dict[str, dict[str, Any]] = {}
    # Our own 127.0.0.1 holds every instance port while `up` runs: the port check happens on each host,
    # in its own network stack, where these ports are free.
    with contextlib.ExitStack() as squatters:
        for port in instance_ports(fleet):
            squatters.enter_context(listening("127.0.0.1", port))
        code, out, err = await cli("up", "-f", str(fleet))
    try:
        assert code == 0, out + err
        assert "2/2 ready" in out and out.count("verified: model") == 2, out
        records = state_records(fleet)
        assert set(records) == INSTANCES
        for host in netns_hosts:
            assert_only_inside(host, records[f"{host.name}-0"])

        code, out, err = await cli("status", "--json", "-f", str(fleet))
        assert code == 0, err
        rows = {row["instance"]: row for row in json.loads(out)}
        assert set(rows) == INSTANCES
        for row in rows.values():
            assert row["ready"] is True and row["drift"] == [] and row["problem"] == "", row
            assert row["url"].startswith("http://127.0.0.1:")  # a local tunnel end, not the host's port

        await run_a_small_job(fleet, tmp_path)
    finally:
        down_code, down_out, down_err = await cli("down", "-f", str(fleet))
    assert down_code == 0, down_out + down_err
    assert records and all(_is_gone(int(record["pid"])) for record in records.values())


def assert_only_inside(host: NetnsHost, record: dict[str, Any]) -> None:
    """The instance runs in `host`'s network namespace on ITS 127.0.0.1: from here it is reachable neither
    at our 127.0.0.1 nor at the host's address, while the host itself answers at that address."""
    port, pid = int(record["port"]), int(record["pid"])
    assert net_inode(pid) == host.net_inode() != net_inode(os.getpid())
    assert refused("127.0.0.1", port) and refused(host.address, port)
    socket.create_connection((host.address, host.port), timeout=10).close()  # routing works: it is the bind


def instance_ports(fleet: Path) -> list[int]:
    return [inst.port for inst in load_fleet(fleet).instances()]


@contextlib.contextmanager
def listening(address: str, port: int) -> Iterator[socket.socket]:
    """A socket LISTENing on address:port in the root namespace while the block runs."""
    with socket.socket() as sock:
        sock.bind((address, port))
        sock.listen()
        yield sock


async def test_public_bind_is_reached_at_the_hosts_address_with_the_key(
    netns_hosts: list[NetnsHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bind = 0.0.0.0 inside a namespace means its lo + veth only: fleetgen goes straight to 10.231.N.2."""
    key = "sk-netns-" + os.urandom(8).hex()
    monkeypatch.setenv("FLEETGEN_NETNS_KEY", key)
    fleet = sim_fleet(tmp_path, netns_hosts, 'bind = "0.0.0.0"\napi_key_env = "FLEETGEN_NETNS_KEY"\n')
    code, out, err = await cli("up", "-f", str(fleet))
    try:
        assert code == 0, out + err
        code, out, err = await cli("status", "--json", "-f", str(fleet))
        assert code == 0, err
        rows = {row["host"]: row for row in json.loads(out)}
        async with aiohttp.ClientSession() as http:
            for host in netns_hosts:
                url = rows[host.name]["url"]
                assert url == f"http://{host.address}:{rows[host.name]['port']}" and rows[host.name]["ready"]
                async with http.get(url + "/v1/models") as anonymous:
                    assert anonymous.status == 401
                async with http.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as ok:
                    assert ok.status == 200
                assert refused("127.0.0.1", rows[host.name]["port"])  # still not on OUR loopback
    finally:
        down_code, down_out, down_err = await cli("down", "-f", str(fleet))
    assert down_code == 0, down_out + down_err


async def test_loopback_bind_on_an_ssh_host_is_refused_before_anything_starts(
    netns_hosts: list[NetnsHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bind = 127.0.0.2 is the host's own loopback: fleetgen, on another machine, can never reach it there."""
    monkeypatch.setenv("FLEETGEN_NETNS_KEY", "sk-unused-0123456789")
    lines = 'bind = "127.0.0.2"\napi_key_env = "FLEETGEN_NETNS_KEY"\n'
    fleet = sim_fleet(tmp_path, netns_hosts[:1], lines, ready_timeout_s=5.0)
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        # `up` exits 1 when an instance is not ready, whatever the cause (here a ConfigError's).
        assert code == 1 and "engine.bind" in err and "spawned pid" not in err, out + err
    finally:
        await cli("down", "-f", str(fleet))


async def run_a_small_job(fleet: Path, tmp_path: Path) -> None:
    """`fleetgen run -f`: every record once, written by both instances (each only reachable by SSH)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(
        b"".join(orjson.dumps({"id": f"r{i}", "prompt": f"question {i}"}) + b"\n" for i in range(24))
    )
    out = tmp_path / "out"
    code, stdout, err = await cli(
        "run", str(prompts), "-o", str(out), "-f", str(fleet), "--max-tokens", "16", "--no-live", "--json"
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["status"] == "complete" and summary["results"] == 24 and summary["errors"] == 0, summary
    with sqlite3.connect(out / "results.sqlite") as conn:
        rows = list(conn.execute("SELECT id, sample, instance FROM results"))
    assert sorted((r[0], r[1]) for r in rows) == sorted((f"r{i}", 0) for i in range(24))
    assert {r[2] for r in rows} == INSTANCES


def _is_gone(pid: int) -> bool:
    """Gone or a zombie (PID 1 reaps lazily; the test hosts share this machine's /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    except OSError:
        return True
