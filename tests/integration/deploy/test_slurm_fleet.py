"""A fleet placed by a REAL Slurm cluster (tests/fixtures/slurm.py): `up`, `status`, `run`, a job ended by
Slurm mid-run, `--restart-dead`, `down`; and the cluster's refusals answered before anything is queued.

The servers are `fleetgen.sim` processes (SGLang cannot start without a GPU); everything else is real: sbatch,
the allocation, Slurm's GRES, `scancel`, the node (this machine, `node_access = "local"`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest

from tests.fixtures.fleetcli import (
    RUN_FLAGS,
    SIM_SPEC_ARGS,
    assert_every_record_once,
    cli,
    finish,
    fleetgen,
    is_gone,
    query,
    text_appears,
    wait_for_rows,
    write_prompts,
)
from tests.fixtures.ports import free_ports
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.support import toml_value

NUM_SERVERS = 4
SIM_ARGS = {
    **SIM_SPEC_ARGS,
    "sim-decode-tps": 12.0,
}  # slow enough that a job ended mid-run has requests in flight


def write_cluster_fleet(
    tmp_path: Path,
    engine_extra: str = "",
    engine: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    cluster: Mapping[str, object] | None = None,
) -> Path:
    """A fleet file of NUM_SERVERS sim servers placed by the test cluster; `cluster` overrides [cluster];
    `engine`, when given, is the whole [engine] table instead of the sim's ([engine.args] as its "args"),
    `env` is [engine.env]."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    sim = {
        "kind": "sglang",
        "python": sys.executable,
        "model": str(model),
        "launcher": ["-m", "fleetgen.sim"],
    }
    eng = dict(engine or {**sim, "ready_timeout_s": 120.0, "args": SIM_ARGS})
    args = eng.pop("args", {})
    assert isinstance(args, Mapping)
    values: dict[str, object] = {
        "kind": "slurm",
        "partition": "gpu",
        "gpus": NUM_SERVERS,
        "time": "00:30:00",
        "node_access": "local",
        "workdir": str(tmp_path / "work"),
        "base_port": free_ports(1)[0],
        "gpu_memory_gib": 80.0,
        "pending_timeout_s": 60.0,
        **(cluster or {}),
    }
    lines = [
        "[engine]",
        *(f"{k} = {toml_value(v)}" for k, v in eng.items()),  # type: ignore[arg-type]
        engine_extra,
        "",
        "[engine.args]",
        *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in args.items()),
        "",
        "[engine.env]",
        *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in (env or {}).items()),
        "",
        "[cluster]",
        *(f"{k} = {toml_value(v)}" for k, v in values.items()),  # type: ignore[arg-type]
    ]
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def state(fleet: Path) -> dict[str, dict[str, object]]:
    records: dict[str, dict[str, object]] = json.loads(
        (fleet.parent / ".fleetgen" / "state.json").read_text()
    )["instances"]
    return records


async def statuses(fleet: Path) -> dict[str, dict[str, object]]:
    code, out, err = await cli("status", "--json", "-f", str(fleet))
    assert code in (0, 1), out + err
    return {s["instance"]: s for s in json.loads(out)}


async def job_left(cluster: SlurmCluster, job: str) -> None:
    """Until Slurm no longer lists the job as queued or running."""
    while True:
        if job not in cluster.job_ids():
            return
        await asyncio.sleep(0.2)


def our_processes(workdir: Path) -> list[int]:
    """PIDs of live processes whose cwd is in this fleet's workdir (the servers run there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or is_gone(int(proc.name)):
            continue
        try:
            cwd = (proc / "cwd").readlink()
        except OSError:
            continue
        if cwd.is_relative_to(workdir):
            found.append(int(proc.name))
    return found


async def test_a_slurm_fleet_serves_a_job_exactly_once_through_a_preemption(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    fleet = write_cluster_fleet(tmp_path)
    names = {f"slurm-{k}" for k in range(NUM_SERVERS)}
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert f"{NUM_SERVERS}/{NUM_SERVERS} ready" in out
        jobs = {name: str(rec["placement_id"]) for name, rec in state(fleet).items()}
        assert set(jobs) == names and set(slurm_cluster.job_ids()) == set(jobs.values())  # one job per server
        for name, st in (await statuses(fleet)).items():
            assert st["ready"] is True, st
            assert st["placement"] == f"Slurm job {jobs[name]} on {slurm_cluster.node}"

        prompts = write_prompts(tmp_path / "p.jsonl", 500)
        result = tmp_path / "out"
        victim = "slurm-1"
        run = ["run", str(prompts), "-o", str(result), "-f", str(fleet), "--restart-dead", *RUN_FLAGS]
        async with fleetgen(*run) as proc:
            await asyncio.wait_for(wait_for_rows(result, 40, proc), 120)
            ended_at = time.time()
            slurm_cluster.run("scancel", jobs[victim])  # as a preemption would end it
            stdout, stderr = await finish(proc)
        assert proc.returncode == 0, stderr.decode()
        assert_every_record_once(result, stdout, 500)
        back = state(fleet)[victim]
        assert back["placement_id"] != jobs[victim]  # resubmitted through Slurm by --restart-dead
        after = f"SELECT COUNT(*) FROM results WHERE instance = '{victim}' AND started_at > {ended_at}"
        assert query(result, after)[0][0] > 0  # and used again by the same job

        other = "slurm-2"
        other_job = str(state(fleet)[other]["placement_id"])
        slurm_cluster.run("scancel", other_job)
        await asyncio.wait_for(job_left(slurm_cluster, other_job), 60)  # COMPLETING until slurmd says done
        shown = (await statuses(fleet))[other]
        assert shown["ready"] is False and "ended: CANCELLED" in str(shown["problem"])  # Slurm's own state
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    assert slurm_cluster.job_ids() == []  # nothing of ours queued or running
    assert our_processes(tmp_path / "work") == []  # and no process left on the node


async def test_the_runs_own_log_says_how_slurm_ended_a_servers_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A server's job cancelled under a run (as an admin's scancel or a preemption ends it): where the run's
    own log reports the server down it reads Slurm's words, not only the request's "Server disconnected";
    the job goes on with the other server."""
    fleet = write_cluster_fleet(tmp_path, cluster={"gpus": 2})
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        job = str(state(fleet)["slurm-1"]["placement_id"])
        prompts, result, log = (
            write_prompts(tmp_path / "p.jsonl", 150),
            tmp_path / "out",
            tmp_path / "run.log",
        )
        with log.open("wb") as err_file:
            run = ["run", str(prompts), "-o", str(result), "-f", str(fleet), *RUN_FLAGS]
            async with fleetgen(*run, stderr=err_file) as proc:
                await asyncio.wait_for(wait_for_rows(result, 20, proc), 120)
                slurm_cluster.run("scancel", job)
                said = f"slurm-1 is down: Slurm job {job} ended: CANCELLED"
                await asyncio.wait_for(text_appears(log, said, proc), 120)
                stdout, _ = await finish(proc)
        assert proc.returncode == 0, log.read_text()
        assert_every_record_once(result, stdout, 150)
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    assert slurm_cluster.job_ids() == [] and our_processes(tmp_path / "work") == []


# The sim, launched through `python -c`: first two helpers that ignore SIGTERM, as vLLM's multiprocessing
# helpers outlive a TERM, one in the engine's process group, one in a session (and group) of its own; when
# Slurm ends the job they are reparented to init and leave proctrack/linuxproc's tree: only `down` itself
# can find them on the node (the second by the SLURM_JOB_ID it carries, not by the engine's group).
HELPER = "['sh', '-c', 'trap \"\" TERM; exec sleep 600']"
WITH_HELPER = (
    f"import runpy, subprocess; subprocess.Popen({HELPER}); "
    f"subprocess.Popen({HELPER}, start_new_session=True); "
    "runpy.run_module('fleetgen.sim', run_name='__main__', alter_sys=True)"
)


@pytest.mark.parametrize("verb", ["down", "restart"])
async def test_what_the_engine_left_on_the_node_is_swept_when_its_job_ends(
    slurm_cluster: SlurmCluster, tmp_path: Path, verb: str
) -> None:
    sim = {
        "kind": "sglang",
        "python": sys.executable,
        "model": str(tmp_path),
        "launcher": ["-c", WITH_HELPER],
    }
    fleet = write_cluster_fleet(
        tmp_path, engine={**sim, "ready_timeout_s": 120.0, "args": SIM_ARGS}, cluster={"gpus": 1}
    )
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        first = state(fleet)["slurm-0"]
        helpers = sorted(p for p in our_processes(tmp_path / "work") if p != first["pid"])
        assert len(helpers) == 2
        code, out, err = await cli(verb, "-f", str(fleet))
        assert code == 0, out + err
        assert all(map(is_gone, helpers)) and f"swept pid(s) {', '.join(map(str, helpers))} left" in out, out
        assert verb == "down" or len(our_processes(tmp_path / "work")) == 3  # restart: new server + helpers
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    assert slurm_cluster.job_ids() == [] and our_processes(tmp_path / "work") == []


@pytest.mark.parametrize(
    ("cluster", "slurm_says", "fix"),
    [
        ({"partition": "nosuchpartition"}, "invalid partition", "cluster.partition"),
        ({"gpus": 16}, "has 4 GPU(s)", "cluster.gpus to at most 4"),
        ({"sbatch_args": ["--gres-flags=nonsense"]}, "Slurm refused", "sbatch_args"),
    ],
)
async def test_what_the_cluster_refuses_is_answered_before_anything_is_queued(
    slurm_cluster: SlurmCluster, tmp_path: Path, cluster: dict[str, object], slurm_says: str, fix: str
) -> None:
    fleet = write_cluster_fleet(tmp_path, cluster=cluster)
    code, out, err = await cli("up", "-f", str(fleet))
    text = " ".join((out + err).split())  # rich wraps long lines
    assert code == 1 and text.count(slurm_says) == 1 and fix in text, text  # once, not once per server
    assert slurm_cluster.job_ids() == []
    assert our_processes(tmp_path / "work") == []
    assert not (fleet.parent / ".fleetgen" / "state.json").exists() or state(fleet) == {}


def files_holding(folder: Path, secret: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and secret in p.read_bytes()]


async def test_the_api_key_reaches_no_file_slurm_keeps(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A public bind with a key: the server refuses requests without it, and the key is in nothing Slurm
    stores (its state folder: job scripts, job environments; slurmd's spool; the logs), nothing fleetgen
    wrote, and no job description Slurm gives out."""
    key = "sk-slurm-" + os.urandom(8).hex()
    monkeypatch.setenv("FLEETGEN_SLURM_TEST_KEY", key)
    engine = 'bind = "0.0.0.0"\napi_key_env = "FLEETGEN_SLURM_TEST_KEY"'
    fleet = write_cluster_fleet(tmp_path, engine_extra=engine, cluster={"gpus": 1})
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        job = str(state(fleet)["slurm-0"]["placement_id"])
        [url] = [str(s["url"]) for s in (await statuses(fleet)).values()]
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/models") as anonymous:
                assert anonymous.status == 401
            async with http.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as ok:
                assert ok.status == 200
        described = slurm_cluster.run("scontrol", "show", "job", "-dd", job).stdout
        script = slurm_cluster.run("scontrol", "write", "batch_script", job, "-").stdout
        assert described and script.startswith("#!/bin/sh") and key not in described + script + out + err
        assert files_holding(slurm_cluster.folder, key.encode()) == []
        assert files_holding(tmp_path, key.encode()) == []  # workdir (key files removed), logs, state
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    assert slurm_cluster.job_ids() == []


async def test_nodes_reached_over_ssh_run_the_same_verification(
    slurm_cluster: SlurmCluster, ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    """`node_access = "ssh"` (the default): the allocated node is reached at Slurm's NodeAddr over real SSH
    (host key checked), and `up`, `status` and `down` verify through it."""
    sshd = ssh_hosts[0]
    fleet = write_cluster_fleet(
        tmp_path,
        cluster={
            "gpus": 2,
            "node_access": "ssh",
            "node_ssh_user": sshd.user,
            "node_ssh_port": sshd.port,
            "identity": str(sshd.identity),
            "known_hosts": str(sshd.known_hosts),
        },
    )
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert "2/2 ready" in out and "verified" in out
        shown = await statuses(fleet)
        assert all(
            s["ready"] is True and f"on {slurm_cluster.node}" in str(s["placement"]) for s in shown.values()
        )
        for s in shown.values():  # reached through an SSH forward to the node, not the port itself
            assert (
                str(s["url"]).startswith("http://127.0.0.1:")
                and str(s["url"]) != f"http://127.0.0.1:{s['port']}"
            )
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    assert slurm_cluster.job_ids() == [] and our_processes(tmp_path / "work") == []


async def test_nodes_reached_through_srun_steps_of_the_servers_own_jobs(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """`node_access = "srun"` (clusters that refuse SSH to compute nodes): every command on the node is a
    step of the server's own job (`srun --overlap --jobid`); up verifies through them, status reads them.
    (No sshd listens on the node's port 22 here: an SSH fallback would fail.)"""
    fleet = write_cluster_fleet(tmp_path, cluster={"gpus": 2, "node_access": "srun"})
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert "2/2 ready" in out and "verified" in out
        shown = await statuses(fleet)
        assert all(s["ready"] is True and s["drift"] == [] for s in shown.values()), shown
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    assert slurm_cluster.job_ids() == [] and our_processes(tmp_path / "work") == []


@pytest.mark.parametrize("state_file", ["missing", "stale"])
async def test_down_ends_the_fleets_jobs_whatever_the_state_file_says(
    slurm_cluster: SlurmCluster, tmp_path: Path, state_file: str
) -> None:
    """README: `down` ends every job of the fleet by name, whatever the state file says: here the file is
    gone (a fresh checkout, a wiped folder) or names a job and pid that no longer exist (a stale copy)."""
    fleet = write_cluster_fleet(tmp_path, cluster={"gpus": 1})
    path = fleet.parent / ".fleetgen" / "state.json"
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert slurm_cluster.job_ids() and our_processes(tmp_path / "work")  # something to end
        if state_file == "missing":
            path.unlink()
        else:
            text = json.loads(path.read_text())
            for record in text["instances"].values():
                record.update(pid=2**22 - 1, placement_id="999999")  # no such process, no such job
            path.write_text(json.dumps(text))
        code, out, err = await cli("down", "-f", str(fleet))
        assert code == 0, out + err
        assert slurm_cluster.job_ids() == [] and our_processes(tmp_path / "work") == []
    finally:
        await cli("down", "-f", str(fleet))
