"""`fleetgen plan` on a `[cluster]` fleet, online: the partition's GRES from `sinfo` and one short `srun`
holding one GPU runs nvidia-smi on a node of the REAL test cluster (tests/fixtures/slurm.py); the plan is
sized from what it printed, and Slurm's or the node's refusals are answered in their words with a fix.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.fixtures.fleetcli import cli
from tests.fixtures.slurm import SlurmCluster
from tests.integration.deploy.support import toml_value
from tests.integration.deploy.test_slurm_fleet import write_cluster_fleet

DATA = Path(__file__).parents[2] / "data"
MODEL = DATA / "models" / "qwen3.6-27b"
REAL_SMI = DATA / "real-engines" / "vllm-0.24.0-h200" / "nvidia-smi-start.txt"  # captured on an H200


def h200_rows() -> tuple[str, int]:
    """The real H200's name and memory.total (MiB) as its nvidia-smi printed them."""
    line = REAL_SMI.read_text().splitlines()[1]  # "NVIDIA H200, 143771 MiB, 0 MiB, 580.159.04"
    name, total = (p.strip() for p in line.split(",")[:2])
    return name, int(re.sub(r"\D", "", total))


def stand_in_nvidia_smi(folder: Path) -> int:
    """Write `folder/nvidia-smi` and return the free GPU's memory.total (MiB).

    A STAND-IN: this machine has no GPU, and the test cluster's GRES GPUs are /dev/null. It answers the
    `--query-gpu=index,name,memory.total,memory.used --format=csv,noheader,nounits` query with the real
    H200's name and memory (tests/data/real-engines), as a node of four H200s where three are busy with
    other jobs' processes and the one Slurm handed to the probe is empty."""
    name, total = h200_rows()
    rows = [f"0, {name}, {total}, 95895", f"1, {name}, {total}, {total}", f"2, {name}, {total}, 0"]
    rows.append(f"3, {name}, {total}, 1")
    script = folder / "nvidia-smi"
    head = "#!/bin/sh\n# fleetgen test stand-in (no GPU here): a real H200's answer\n"
    script.write_text(head + "".join(f"echo '{r}'\n" for r in rows))
    script.chmod(0o755)
    return total


def fleet_file(tmp_path: Path, name: str, **cluster: object) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return write_cluster_fleet(folder, f"model_config = {toml_value(str(MODEL))}", cluster=cluster)


async def plan_json(fleet: Path, *flags: str) -> dict[str, object]:
    code, out, err = await cli("plan", "--json", *flags, "-f", str(fleet))
    assert code in (0, 2), out + err  # 2: an instance does not fit; the sizing is still printed
    plan: dict[str, object] = json.loads(out)
    return plan


def sizing(plan: dict[str, object]) -> list[tuple[object, ...]]:
    instances = plan["instances"]
    assert isinstance(instances, list) and instances
    return [(i["instance"], i["gpus"], i["memory"], i["argv"]) for i in instances]


async def test_online_plan_sizes_from_the_gpu_a_slurm_job_step_sees(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    total_mib = stand_in_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # the PATH the step sees
    fleet = fleet_file(tmp_path, "f", gpu_memory_gib=80.0, gpus=6)  # the cluster has 4
    online = await plan_json(fleet)  # the file's 80 GiB is not what it plans with: the node's GPU is
    stated = fleet.with_name("stated.toml")  # the same fleet, the probed GPU's memory written in it
    stated.write_text(
        fleet.read_text().replace("gpu_memory_gib = 80.0", f"gpu_memory_gib = {total_mib / 1024}")
    )
    offline = await plan_json(stated, "--offline")
    assert sizing(online) == sizing(offline)
    assert sizing(online) != sizing(await plan_json(fleet, "--offline"))  # the file's 80 GiB was not used
    [over] = [w for w in online["warnings"] if w["rule"] == "cluster-gpus"]  # type: ignore[attr-defined]
    assert f"has {slurm_cluster.num_gpus} GPU(s)" in over["message"] and "at most 4" in over["fix"]
    assert slurm_cluster.job_ids() == [] or _only_completing(slurm_cluster)


def _only_completing(cluster: SlurmCluster) -> bool:
    """The probe's job may still be COMPLETING a moment after srun returned; nothing else is left."""
    states = cluster.run("squeue", "-h", "-o", "%T").stdout.split()
    return set(states) <= {"COMPLETING"}


@pytest.mark.parametrize(
    ("cluster", "stand_in", "says", "fix"),
    [
        ({"partition": "nosuchpartition"}, True, "Invalid partition", "cluster.partition"),
        ({}, False, "nvidia-smi is not found on node", "cluster.gpu_memory_gib"),
    ],
)
async def test_what_the_cluster_or_node_refuses_is_answered_with_the_fix(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cluster: dict[str, object],
    stand_in: bool,
    says: str,
    fix: str,
) -> None:
    if stand_in:
        (tmp_path / "bin").mkdir()
        stand_in_nvidia_smi(tmp_path / "bin")
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code, out, err = await cli("plan", "-f", str(fleet_file(tmp_path, "f", **cluster)))
    text = " ".join((out + err).split())  # rich wraps long lines
    assert code == 1 and says in text and fix in text and "Traceback" not in text, text
