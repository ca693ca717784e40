"""`remote.slurm`, the pure side of the Slurm placement: Slurm's answers parsed (scontrol, sacct, sinfo), its
refusals mapped to the field to fix. The sbatch argv is tests/unit/deploy/test_slurm.py."""

from __future__ import annotations

import pytest

from fleetgen.remote.slurm import fix_for, parse_jobs, parse_partition_gpus, parse_sacct

SCONTROL = """\
JobId=7 JobName=fleetgen-slurm-0-ab12cd34 UserId=root(0) JobState=PENDING Reason=Resources Dependency=(null) \
RunTime=00:00:00 TimeLimit=00:30:00 NodeList=(null) BatchHost=(null) ExitCode=0:0 Command=/w/slurm-job.sh
JobId=8 JobName=fleetgen-slurm-1-ab12cd34 UserId=root(0) JobState=RUNNING Reason=None RunTime=00:01:02 \
NodeList=gpu[01-02] BatchHost=gpu02 ExitCode=0:0 Comment=has spaces=in it
JobId=9 JobName=x JobState=TIMEOUT Reason=TimeLimit RunTime=00:30:00 NodeList=gpu03 BatchHost=gpu03 \
ExitCode=0:15
"""


def test_scontrol_lines_give_state_reason_and_the_batch_node() -> None:
    jobs = parse_jobs(SCONTROL)
    assert set(jobs) == {"7", "8", "9"}
    assert (jobs["7"].state, jobs["7"].reason, jobs["7"].node, jobs["7"].is_active) == (
        "PENDING",
        "Resources",
        "",
        True,
    )
    assert (jobs["8"].state, jobs["8"].reason, jobs["8"].node) == ("RUNNING", "", "gpu02")
    assert not jobs["9"].is_active and jobs["9"].describe() == "TIMEOUT (TimeLimit), exit 0:15"
    assert jobs["7"].name == "fleetgen-slurm-0-ab12cd34"


def test_sacct_rows_for_jobs_scontrol_forgot() -> None:
    jobs = parse_sacct(
        "12|CANCELLED by 0|None|gpu01|00:00:12|0:15|n\n13|PREEMPTED|None|gpu02|01:00:00|0:0|m\n"
    )
    assert jobs["12"].state == "CANCELLED" and jobs["12"].reason == "" and jobs["12"].node == "gpu01"
    assert jobs["13"].describe() == "PREEMPTED" and not jobs["13"].is_active


@pytest.mark.parametrize(
    ("sinfo", "total"),
    [
        ("n1|gpu:4|idle", 4),
        ("n1|gpu:h100:8(S:0-1)|mix\nn2|gpu:h100:8(S:0-1)|alloc", 16),
        ("n1|gpu:a100:4,shard:8|idle\nn2|gpu:2|drain\nn3|gpu:2|down*", 4),
        ("n1|(null)|idle", 0),
        ("", 0),
    ],
)
def test_partition_gpus_count_only_nodes_that_can_run_jobs(sinfo: str, total: int) -> None:
    have = parse_partition_gpus(sinfo)
    assert have.total == total == sum(n for _, n in have.per_node)  # per node: what plan's tp check reads


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("sbatch: error: invalid partition specified: nope", "cluster.partition"),
        (
            "allocation failure: Requested time limit is invalid (missing or exceeds some limit)",
            "cluster.time",
        ),
        ("allocation failure: Requested node configuration is not available", "engine.tp"),
        ("sbatch: error: Invalid account or account/partition combination specified", "cluster.account"),
        ("sbatch: unrecognized option '--nonsense'", "sbatch_args"),
        ("something Slurm never said before", "[cluster] table"),
    ],
)
def test_every_refusal_names_a_field_to_change(message: str, field: str) -> None:
    assert field in fix_for(message)
