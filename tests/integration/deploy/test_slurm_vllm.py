"""ONE REAL vLLM-CPU server (the tiny model) placed by the REAL test Slurm cluster: `up` (the SSH hosts'
verification chain on the allocated node) → `status` → `fleetgen run` of a few records → `down`, and
nothing of ours left in `squeue` or on the node. The sim fleets in test_slurm_fleet.py cover the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.fleetcli import cli, query, write_prompts
from tests.fixtures.slurm import SlurmCluster
from tests.fixtures.vllm import TinyModel
from tests.integration.deploy.test_slurm_fleet import our_processes, state, statuses, write_cluster_fleet
from tests.integration.deploy.test_vllm import NGRAM

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RECORDS = 8


async def test_a_real_vllm_cpu_server_placed_by_slurm_serves_a_job(
    slurm_cluster: SlurmCluster, vllm_python: Path, tiny_model: TinyModel, tmp_path: Path
) -> None:
    args = {"enforce-eager": True, "dtype": "bfloat16", "max-model-len": 1024, "speculative-config": NGRAM}
    engine: dict[str, object] = {"kind": "vllm", "python": str(vllm_python), "model": str(tiny_model.path)}
    engine |= {"served_model_name": "tiny", "ready_timeout_s": 600.0, "args": args}
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env |= {"VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "PYTHONUNBUFFERED": "1"}
    env |= {"HF_HOME": str(tmp_path / "hf")}
    fleet = write_cluster_fleet(tmp_path, engine=engine, env=env, cluster={"gpus": 1})
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert "1/1 ready" in out and "verified" in out
        job = str(state(fleet)["slurm-0"]["placement_id"])
        assert slurm_cluster.job_ids() == [job]
        [shown] = (await statuses(fleet)).values()
        assert shown["ready"] is True and shown["drift"] == [], shown
        assert shown["placement"] == f"Slurm job {job} on {slurm_cluster.node}"

        prompts = write_prompts(tmp_path / "p.jsonl", RECORDS)
        result = tmp_path / "out"
        code, out, err = await cli(
            "run",
            str(prompts),
            "-o",
            str(result),
            "-f",
            str(fleet),
            "--max-tokens",
            "8",
            "--no-live",
            "--json",
        )
        assert code == 0, out + err
        summary = json.loads(out)
        assert summary["status"] == "complete" and summary["results"] == RECORDS and summary["errors"] == 0
        rows = query(result, "SELECT id, instance FROM results")
        assert sorted(rows) == sorted((f"r{i}", "slurm-0") for i in range(RECORDS))
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    # vLLM's helpers (EngineCore, its workers, the resource tracker) share the job's process group; when Slurm
    # ends the job they are reparented to init, out of proctrack/linuxproc's reach: `down` sweeps that group.
    assert slurm_cluster.job_ids() == [] and our_processes(tmp_path / "work") == []
