"""`SrunHost` on a REAL Slurm job (tests/fixtures/slurm.py): a node's file reads back byte for byte."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fleetgen.remote import LocalHost
from fleetgen.remote.srun import SrunHost
from tests.fixtures.slurm import SlurmCluster


async def test_a_file_read_through_srun_steps_is_the_exact_bytes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Bytes that are not UTF-8 (a binary file, a /proc environ) come back as they are on the node."""
    output = f"--output={tmp_path / 'job.out'}"
    submitted = slurm_cluster.run("sbatch", "--parsable", "--gres=gpu:1", output, "--wrap", "sleep 120")
    job = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while "RUNNING" not in slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
            assert time.monotonic() < deadline, f"job {job} never ran"
            await asyncio.sleep(0.2)
        data = bytes(range(256)) * 4
        async with LocalHost("login") as login, SrunHost("node", login, job, is_here=True) as node:
            path = str(tmp_path / "blob.bin")
            await node.put(path, data)
            assert await node.read(path) == data
    finally:
        slurm_cluster.run("scancel", job, check=False)
