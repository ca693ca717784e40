"""The test cluster itself (tests/fixtures/slurm.py): a real slurmctld + slurmd that runs GPU jobs."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.fixtures.slurm import SlurmCluster


def ended(slurm_cluster: SlurmCluster, submitted: subprocess.CompletedProcess[str]) -> str:
    """The id of the job `sbatch --parsable` submitted, once Slurm lists it no more (within a minute)."""
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while job in slurm_cluster.job_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job not in slurm_cluster.job_ids()
    return job


def test_a_gpu_job_runs_to_completion_with_slurms_gpu_assigned(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.folder / "probe.out"
    submitted = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "--gres=gpu:1",
        f"--output={out}",
        "--wrap",
        "sleep 1; echo gpus=$CUDA_VISIBLE_DEVICES",
    )
    job = ended(slurm_cluster, submitted)
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
    assert "JobState=COMPLETED" in shown
    assert out.read_text().strip() in {f"gpus={i}" for i in range(slurm_cluster.num_gpus)}


def test_the_cluster_refuses_what_it_cannot_run(slurm_cluster: SlurmCluster) -> None:
    too_many = slurm_cluster.run(
        "sbatch", "--test-only", f"--gres=gpu:{slurm_cluster.num_gpus + 1}", "--wrap", "true", check=False
    )
    assert too_many.returncode != 0 and "Requested node configuration is not available" in too_many.stderr
    too_long = slurm_cluster.run("sbatch", "--test-only", "--time=2:00:00", "--wrap", "true", check=False)
    assert too_long.returncode != 0 and "time limit" in too_long.stderr
    assert slurm_cluster.job_ids() == []


def test_a_job_without_output_writes_in_the_clusters_folder_never_in_the_checkout(
    slurm_cluster: SlurmCluster,
) -> None:
    """sbatch's default output is `slurm-N.out` in the folder it was run from; pytest runs from the checkout,
    where three of them were once committed (issue 30). The fixture submits from the cluster's own folder."""
    job = ended(slurm_cluster, slurm_cluster.run("sbatch", "--parsable", "--wrap", "echo written"))
    assert (slurm_cluster.folder / f"slurm-{job}.out").read_text() == "written\n"
    assert not (Path.cwd() / f"slurm-{job}.out").exists()
