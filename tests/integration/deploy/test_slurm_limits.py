"""A partition's limits answered before anything is queued, on a REAL Slurm cluster (tests/fixtures/slurm.py)
configured as Slurm ships it (`EnforcePartLimits=NO`: `sbatch --test-only` accepts a job over MaxTime, which
then pends for ever) as well as with the limits enforced at submit (ALL); a fleet-wide refusal said once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.deploy.placement.slurm import wait_running
from fleetgen.errors import DeployError
from fleetgen.remote.local import LocalHost
from tests.fixtures.fleetcli import cli
from tests.fixtures.slurm import SlurmCluster
from tests.integration.deploy.test_slurm_fleet import NUM_SERVERS, our_processes, write_cluster_fleet

OVER_MAX_TIME = "02:00:00"  # the test partition's MaxTime is 01:00:00


async def refused_before_queued(
    cluster: SlurmCluster, tmp_path: Path, fields: dict[str, object], says: str, fix: str
) -> None:
    """`up` of NUM_SERVERS servers exits 1 saying `says` once (not once per server) and naming `fix`, and
    Slurm never saw a job: none queued, none ended (`scontrol` remembers ended jobs for an hour)."""
    before = cluster.every_job_id()
    fleet = write_cluster_fleet(tmp_path, cluster=fields)
    code, out, err = await cli("up", "-f", str(fleet))
    text = " ".join((out + err).split())  # rich wraps long lines
    assert code == 1 and text.count(says) == 1 and fix in text, text
    assert ", ".join(f"slurm-{k}" for k in range(NUM_SERVERS)) in text  # the one block names every server
    assert cluster.every_job_id() == before
    assert our_processes(tmp_path / "work") == []


@pytest.mark.parametrize("enforce", ["NO", "ALL"])  # Slurm's default; limits enforced at submit
async def test_a_time_limit_over_max_time_is_refused_before_anything_is_queued(
    slurm_cluster: SlurmCluster, tmp_path: Path, enforce: str
) -> None:
    with slurm_cluster.configured(EnforcePartLimits=enforce):
        await refused_before_queued(
            slurm_cluster,
            tmp_path,
            {"time": OVER_MAX_TIME},
            f"cluster.time = {OVER_MAX_TIME} is over partition gpu's MaxTime 01:00:00",
            "lower cluster.time to at most 01:00:00",
        )


@pytest.mark.parametrize(
    ("partition", "fields", "says", "fix"),
    [
        (
            {"AllowAccounts": "team_a"},
            {"account": "team_b"},
            "partition gpu does not let account team_b run jobs (it allows team_a)",
            "set cluster.account to one partition gpu allows",
        ),
        ({"MinNodes": "2"}, {}, "partition gpu runs no single-node job", "set cluster.partition"),
        ({"State": "DOWN"}, {}, "partition gpu is DOWN", "set cluster.partition to another"),
    ],
)
async def test_partition_limits_slurms_default_queues_are_refused_before_anything_is_queued(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    partition: dict[str, str],
    fields: dict[str, object],
    says: str,
    fix: str,
) -> None:
    with slurm_cluster.configured(EnforcePartLimits="NO"), slurm_cluster.partition_set(**partition):
        await refused_before_queued(slurm_cluster, tmp_path, fields, says, fix)


async def test_a_pending_reason_is_judged_once_slurm_has_settled_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A job over MaxTime that Slurm's default configuration queued: its first pending reason is the
    generic PartitionConfig, replaced by PartitionTimeLimit a moment later; the wait answers the latter
    (the fix names cluster.time) and cancels the job."""
    with slurm_cluster.configured(EnforcePartLimits="NO"):
        submitted = slurm_cluster.run(
            "sbatch",
            "--parsable",
            "--job-name=fleetgen-settle",
            f"--time={OVER_MAX_TIME}",
            f"--output={tmp_path / 'settle.out'}",
            "--wrap",
            "true",
        )
        job = submitted.stdout.strip().split(";")[0]
        async with LocalHost("login") as login:
            with pytest.raises(DeployError) as refused:
                await wait_running(login, job, "slurm-0", lambda _i, _m: None, timeout_s=120.0)
    assert "PartitionTimeLimit" in refused.value.message and "cluster.time" in refused.value.fix
    assert job not in slurm_cluster.job_ids()  # cancelled
