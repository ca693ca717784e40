"""The test cluster itself (tests/fixtures/slurm.py): a real slurmctld + slurmd that runs GPU jobs."""

from __future__ import annotations

import time

from tests.fixtures.slurm import SlurmCluster


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
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while job in slurm_cluster.job_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job not in slurm_cluster.job_ids()
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
