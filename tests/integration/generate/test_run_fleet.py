"""`fleetgen run -f fleet.toml` against a fleet brought up by `fleetgen up` over REAL sshd hosts.

SGLang cannot start without a GPU, so the engine is `fleetgen.sim` (engine.launcher = -m fleetgen.sim), a
real process per instance speaking SGLang's HTTP surface; everything else is real: `fleetgen up`, the state
file, the SSH tunnels the run holds for the job, `/metrics` scraped through them, and `--restart-dead`
restarting a SIGKILLed instance through the deploy layer while the job goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fixtures.fleetcli import (
    RUN_FLAGS,
    SIM_SPEC_ARGS,
    assert_every_record_once,
    cli,
    finish,
    fleetgen,
    process_gone,
    query,
    wait_for_rows,
    write_prompts,
)
from tests.fixtures.ports import free_port
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.support import ArgValue, write_fleet

INSTANCES = {"h0-0", "h0-1", "h1-0", "h1-1"}
SECRET_ENV_VALUE = "do-not-store-this-value"
SIM_ARGS: dict[str, ArgValue] = {
    **SIM_SPEC_ARGS,
    "reasoning-parser": "qwen3",
    # Slow enough decoding that a run lasts long enough to scrape /metrics and to kill a server mid-run.
    # Steps/s: × the accept length (2.6 by default) with speculative decoding on, ≈ 16 tok/s.
    "sim-decode-tps": 6.0,
}


def read_meta(out: Path) -> dict[str, Any]:
    """The meta table as the dashboard reads it: JSON values decoded, plain strings kept."""
    meta: dict[str, Any] = {}
    for key, value in query(out, "SELECT key, value FROM meta"):
        try:
            meta[key] = json.loads(value)
        except ValueError:
            meta[key] = value
    return meta


@pytest.fixture
async def fleet(ssh_hosts: list[SshdHost], tmp_path: Path) -> AsyncIterator[Path]:
    """2 hosts × 2 instances of fleetgen.sim, up (verified) through `fleetgen up`; down afterwards."""
    async with fleet_up(ssh_hosts[:2], tmp_path) as path:
        yield path


@contextlib.asynccontextmanager
async def fleet_up(hosts: list[SshdHost], tmp_path: Path) -> AsyncIterator[Path]:
    """Two instances of fleetgen.sim on each of `hosts`, up through `fleetgen up`; down afterwards."""
    model = tmp_path / "model"
    model.mkdir()
    path = write_fleet(
        tmp_path / "fleet.toml",
        hosts,
        kind="sglang",
        python=sys.executable,
        model=str(model),
        workdir_tag=tmp_path.name,
        gpus=(0, 1),
        launcher=["-m", "fleetgen.sim"],
        ready_timeout_s=120.0,
        args=SIM_ARGS,
        env={"SIM_TOKEN": SECRET_ENV_VALUE},
    )
    code, out, err = await cli("up", "-f", str(path))
    try:
        assert code == 0, out + err
        yield path
    finally:
        code, out, err = await cli("down", "-f", str(path))
        assert code == 0, out + err


def instance_pids(fleet: Path) -> dict[str, int]:
    """The PIDs `fleetgen up` recorded (`.fleetgen/state.json` next to the fleet file)."""
    state = json.loads((fleet.parent / ".fleetgen" / "state.json").read_text())
    return {name: int(record["pid"]) for name, record in state["instances"].items()}


async def test_run_on_a_deployed_fleet_every_record_once_with_job_meta(fleet: Path, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 200)
    out = tmp_path / "out"
    code, stdout, err = await cli(
        "run", str(prompts), "-o", str(out), "-f", str(fleet), "--max-tokens", "64", "--no-live", "--json"
    )
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["status"] == "complete" and summary["results"] == 200 and summary["errors"] == 0
    got = query(out, "SELECT id, sample, instance FROM results")
    assert len(got) == 200 and {(r[0], r[1]) for r in got} == {(f"r{i}", 0) for i in range(200)}
    assert {r[2] for r in got} == INSTANCES  # rows name the instance that wrote them; all four worked

    meta = read_meta(out)
    assert meta["total"] == 200 and isinstance(meta["total"], int)
    assert isinstance(meta["finished_at"], float) and meta["finished_at"] <= time.time()
    assert meta["fleet"]["kind"] == "sglang" and meta["fleet"]["instances"] == sorted(INSTANCES)
    assert meta["engine_args"]["max-running-requests"] == 8
    assert meta["fleet"]["env_names"] == ["SIM_TOKEN"]
    assert SECRET_ENV_VALUE not in json.dumps(meta)  # env values never reach the store

    series = query(out, "SELECT instance, accept_length FROM timeseries WHERE accept_length IS NOT NULL")
    assert {name for name, _ in series} <= INSTANCES and series  # scraped from each server's /metrics
    assert all(accept > 1.0 for _, accept in series)


KV_CELL = 8  # the fleet table's "KV use" column


async def test_kv_use_of_a_fleet_file_shows_in_status_and_the_dashboard(fleet: Path) -> None:
    """Every ready instance's KV use, read from its /metrics: `status --json` gives the fraction, the
    dashboard (-f, no job) a percent in its fleet table (that column was empty with a fleet file)."""
    port = free_port()
    async with fleetgen("dashboard", "-f", str(fleet), "--port", str(port)) as proc:
        try:
            table = await asyncio.wait_for(fleet_table(f"http://127.0.0.1:{port}/api/state", proc), 120)
        finally:
            if proc.returncode is None:
                proc.terminate()
            _, stderr = await finish(proc)
    assert proc.returncode is None or table != "the dashboard exited", stderr.decode()
    rows = re.findall(r'<tr class="instance[^"]*" data-instance="([^"]+)"[^>]*>(.*?)</tr>', table, re.S)
    cells = {name: re.findall(r"<td[^>]*>(.*?)</td>", body, re.S) for name, body in rows}
    assert set(cells) == INSTANCES, table
    for name, row in cells.items():
        assert re.fullmatch(r"\d+%", row[KV_CELL]) and int(row[KV_CELL][:-1]) <= 100, (name, row)

    code, stdout, err = await cli("status", "--json", "-f", str(fleet))
    assert code == 0, err
    statuses = json.loads(stdout)
    assert {s["instance"] for s in statuses} == INSTANCES
    assert all(s["ready"] and 0.0 <= s["kv_usage"] <= 1.0 for s in statuses), statuses


async def fleet_table(url: str, proc: asyncio.subprocess.Process) -> str:
    """The dashboard's fleet table once every instance in it is ready (the server may still be starting)."""
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.returncode is not None:
                return "the dashboard exited"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url) as resp:
                    state = await resp.json()
                    table = str(state["fragments"]["fleet"])
                    if table.count('data-health="ready"') == len(INSTANCES):
                        return table
            await asyncio.sleep(0.5)


async def test_restart_dead_brings_a_killed_instance_back_into_the_job(fleet: Path, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 240)
    out = tmp_path / "out"
    run = ["run", str(prompts), "-o", str(out), "-f", str(fleet), "--restart-dead", "--concurrency", "4"]
    async with fleetgen(*run, *RUN_FLAGS) as proc:
        await asyncio.wait_for(wait_for_rows(out, 20, proc), 120)
        victim = "h0-0"
        old_pid = instance_pids(fleet)[victim]
        killed_at = time.time()
        os.kill(old_pid, signal.SIGKILL)  # the test hosts are this machine
        stdout, stderr = await finish(proc)
    assert proc.returncode == 0, stderr.decode()
    assert_every_record_once(out, stdout, 240)

    new_pid = instance_pids(fleet)[victim]
    assert new_pid != old_pid  # restarted through the deploy layer (the state file names the new process)
    after = query(
        out, f"SELECT COUNT(*) FROM results WHERE instance = '{victim}' AND started_at > {killed_at}"
    )
    assert after[0][0] > 0  # and used again by the same job after the restart


async def kill_instances(fleet: Path, names: list[str]) -> dict[str, int]:
    """SIGKILL instances (the test hosts are this machine) and wait until each process is gone; their PIDs."""
    pids = {name: pid for name, pid in instance_pids(fleet).items() if name in names}
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    for pid in pids.values():
        await asyncio.wait_for(process_gone(pid), 30)
    return pids


async def test_an_instance_down_at_the_start_joins_once_fleetgen_up_brings_it_back(
    fleet: Path, tmp_path: Path
) -> None:
    """h0-0 is dead when the job starts; the user runs `fleetgen up` while the job runs: the job takes it in
    (its tunnel was opened at the start, before anything listened behind it) and gives it rows."""
    victim = "h0-0"
    await kill_instances(fleet, [victim])
    prompts = write_prompts(tmp_path / "p.jsonl", 300)
    out = tmp_path / "out"
    async with fleetgen(
        "run", str(prompts), "-o", str(out), "-f", str(fleet), "--concurrency", "2", *RUN_FLAGS
    ) as proc:
        await asyncio.wait_for(wait_for_rows(out, 20, proc), 120)
        assert query(out, f"SELECT COUNT(*) FROM results WHERE instance = '{victim}'")[0][0] == 0
        up_at = time.time()
        code, up_out, up_err = await cli("up", "-f", str(fleet))
        assert code == 0, up_out + up_err
        stdout, stderr = await finish(proc)
    assert proc.returncode == 0, stderr.decode()
    assert f"{victim} is not ready (not running): it joins once ready" in stderr.decode()
    assert_every_record_once(out, stdout, 300)
    after = query(out, f"SELECT COUNT(*) FROM results WHERE instance = '{victim}' AND started_at > {up_at}")
    assert after[0][0] > 0  # it came back and the same job used it
    assert read_meta(out)["fleet"]["instances"] == sorted(INSTANCES)  # the job's set: every instance


async def test_restart_dead_restarts_an_instance_dead_at_the_start(fleet: Path, tmp_path: Path) -> None:
    victim = "h1-1"
    old_pid = (await kill_instances(fleet, [victim]))[victim]
    prompts = write_prompts(tmp_path / "p.jsonl", 240)
    out = tmp_path / "out"
    run = ["run", str(prompts), "-o", str(out), "-f", str(fleet), "--restart-dead", "--concurrency", "2"]
    async with fleetgen(*run, *RUN_FLAGS) as proc:
        stdout, stderr = await finish(proc)
    assert proc.returncode == 0, stderr.decode()
    assert f"{victim} is not ready (not running): restarting it in the background" in stderr.decode()
    assert_every_record_once(out, stdout, 240)
    assert instance_pids(fleet)[victim] != old_pid  # restarted through the deploy layer, by the job
    assert query(out, f"SELECT COUNT(*) FROM results WHERE instance = '{victim}'")[0][0] > 0


async def test_no_instance_ready_waits_then_fails_naming_each_problem(fleet: Path, tmp_path: Path) -> None:
    await kill_instances(fleet, sorted(INSTANCES))
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    out = tmp_path / "out"
    code, stdout, err = await cli(
        "run", str(prompts), "-o", str(out), "-f", str(fleet), "--wait-ready", "2", "--no-live"
    )
    assert code == 1 and stdout == ""  # the fleet is down, the input is fine: 1
    text = " ".join(err.split())  # rich wraps long lines
    assert f"no instance of {fleet} is ready yet: waiting up to 2 s for a first one" in text
    assert "no server became ready within 2 s: nothing to generate with" in text
    for name in INSTANCES:
        assert f"{name} (down): not running" in text
    assert "fleetgen status" in text and "fleetgen up" in text
    assert query(out, "SELECT COUNT(*) FROM results")[0][0] == 0


async def test_a_host_whose_ssh_went_away_comes_back_into_the_job(
    ssh_hosts: list[SshdHost], sshd_factory: Callable[[str], SshdHost], tmp_path: Path
) -> None:
    """h0's sshd goes away mid-job (its connections drop, reconnects are refused until the tunnels' own
    reconnect gives up); the job goes on with h1. Once sshd is back, the job's probes reconnect h0, its
    tunnels re-open on the same local ports, and h0's instances get rows again. h0 is this test's own
    sshd: stopping a session host would cut every other test's connections to it."""
    prompts = write_prompts(tmp_path / "p.jsonl", 200)
    out = tmp_path / "out"
    h0 = sshd_factory("h0")
    async with (
        fleet_up([h0, ssh_hosts[1]], tmp_path) as fleet,
        fleetgen(
            "run", str(prompts), "-o", str(out), "-f", str(fleet), "--concurrency", "2", *RUN_FLAGS
        ) as proc,
    ):
        await asyncio.wait_for(wait_for_rows(out, 20, proc), 120)
        await asyncio.to_thread(h0.stop)
        try:
            await asyncio.wait_for(wait_for_rows(out, 60, proc), 120)  # on h1 alone meanwhile
        finally:
            await asyncio.to_thread(h0.start)
        back_at = time.time()
        stdout, stderr = await finish(proc)
    assert proc.returncode == 0, stderr.decode()
    assert_every_record_once(out, stdout, 200)
    after = query(out, f"SELECT COUNT(*) FROM results WHERE instance LIKE 'h0-%' AND started_at > {back_at}")
    assert after[0][0] > 0
