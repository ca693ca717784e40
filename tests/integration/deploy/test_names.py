"""Hosts whose names prefix each other (`gpu`, `gpu-1`) over REAL sshd, with `fleetgen.sim` as the engine.

Each command must act on exactly the instance named, on exactly its own host: `logs gpu-1-0` reads host
gpu-1's log, `status --only gpu-1-0` shows that one instance, `down --only gpu-1-0` stops it and leaves
`gpu-0` running, `down --only gpu` stops gpu's instance and nothing of gpu-1. (It used to match hosts by
string prefix: `gpu-1-0` starts with `gpu-`.) A fleet where `gpu` has an instance named `gpu-1` is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from pathlib import Path

from fleetgen.config import load_fleet
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.test_sglang import FLEETGEN, sim_fleet


async def _fleetgen(*argv: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [FLEETGEN, *argv], capture_output=True, text=True, check=False
    )


def _is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in "ZX"
    except OSError:
        return False


async def test_prefix_named_hosts_each_command_acts_on_exactly_its_instance(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    gpu = dataclasses.replace(ssh_hosts[0], name="gpu")
    gpu_1 = dataclasses.replace(ssh_hosts[1], name="gpu-1")
    fleet = sim_fleet(tmp_path, [gpu, gpu_1])
    ports = {i.name: i.port for i in load_fleet(fleet).instances()}
    assert set(ports) == {"gpu-0", "gpu-1-0"}
    try:
        outs = {o.instance: o for o in await up(Fleet.load(fleet))}
        assert all(o.error is None for o in outs.values()), outs
        assert (outs["gpu-0"].host, outs["gpu-1-0"].host) == ("gpu", "gpu-1")

        logs = await _fleetgen("logs", "gpu-1-0", "-n", "400", "--fleet", str(fleet))
        assert logs.returncode == 0, logs.stderr
        assert f"Uvicorn running on http://127.0.0.1:{ports['gpu-1-0']} " in logs.stdout
        assert f"Started server process [{outs['gpu-1-0'].pid}]" in logs.stdout
        not_an_instance = await _fleetgen("logs", "gpu-1", "--fleet", str(fleet))  # a host's name
        assert not_an_instance.returncode == 2 and "no instance named 'gpu-1'" in not_an_instance.stderr

        status = await _fleetgen("status", "--json", "--only", "gpu-1-0", "-f", str(fleet))
        assert status.returncode == 0, status.stderr
        assert [(r["instance"], r["host"]) for r in json.loads(status.stdout)] == [("gpu-1-0", "gpu-1")]

        stopped = await _fleetgen("down", "--only", "gpu-1-0", "-f", str(fleet))
        assert stopped.returncode == 0, stopped.stderr + stopped.stdout
        assert "gpu-1-0" in stopped.stdout and "gpu-0 " not in stopped.stdout
        assert not _is_running(outs["gpu-1-0"].pid or 0) and _is_running(outs["gpu-0"].pid or 0)

        again = {
            o.instance: o for o in await up(Fleet.load(fleet), only=["gpu-1"])
        }  # the host gpu-1: its instances
        assert list(again) == ["gpu-1-0"] and again["gpu-1-0"].error is None
        stopped = await _fleetgen("down", "--only", "gpu", "-f", str(fleet))
        assert stopped.returncode == 0, stopped.stderr + stopped.stdout
        assert not _is_running(outs["gpu-0"].pid or 0) and _is_running(again["gpu-1-0"].pid or 0)
    finally:
        await down(Fleet.load(fleet))


async def test_a_fleet_whose_names_collide_is_refused_before_connecting(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    gpu = dataclasses.replace(ssh_hosts[0], name="gpu")
    gpu_1 = dataclasses.replace(ssh_hosts[1], name="gpu-1")
    fleet = sim_fleet(tmp_path, [gpu, gpu_1], gpus=(0, 1))  # gpu's second instance would be `gpu-1`
    done = await _fleetgen("up", "-f", str(fleet))
    if done.returncode != 2:  # it launched something: stop it before failing
        await _fleetgen("down", "-f", str(fleet))
    assert done.returncode == 2, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert "hosts[1].name: host 'gpu-1' has the name of instance 1 of host 'gpu'" in err
    assert "rename host 'gpu-1'" in err
    assert not (gpu.workdir / tmp_path.name).exists()  # refused before any host was touched
