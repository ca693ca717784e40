"""A partition's limits (`scontrol show partition -o`) against what a fleet's servers ask for: every limit a
job breaks is refused with its fix, and a job within every limit is refused by none (the invariant, over any
time, account, QOS and width). Slurm's time limits read as seconds, as `sbatch --time` reads them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.config import SlurmCluster
from fleetgen.config.slurm import slurm_time_s
from fleetgen.remote.partition import PartitionLimits, parse_partition, partition_refusals
from fleetgen.remote.slurm import hopeless_fix, parse_partition_gpus

# As Debian's Slurm 23 writes it (the test cluster's partition, with an account list).
SHOWN = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=team_a,team_c AllowQos=ALL AllocNodes=ALL Default=YES "
    "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=1-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=vm PriorityJobFactor=1 State=UP "
    "TotalCPUs=16 TotalNodes=1 JobDefaults=(null) TRES=cpu=16,mem=16000M,node=1,billing=16"
)
FOUR_GPUS = parse_partition_gpus("n1|gpu:4|idle\nn2|gpu:2|mix")


def cluster(**values: Any) -> SlurmCluster:
    return SlurmCluster.model_validate(
        {"kind": "slurm", "partition": "gpu", "gpus": 4, "time": "60", **values}
    )


def test_scontrols_line_gives_the_limits() -> None:
    part = parse_partition(SHOWN)
    assert part == PartitionLimits("gpu", "UP", "1-00:00:00", 0, None, ("team_a", "team_c"), (), None, ())
    denied = parse_partition("PartitionName=p DenyAccounts=x DenyQos=low,scavenger MaxNodes=4 State=DRAIN")
    assert denied is not None and denied.allow_accounts is None and denied.deny_qos == ("low", "scavenger")
    assert (denied.max_nodes, denied.state) == (4, "DRAIN")
    assert parse_partition("Partition nosuch not found") is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400),
        ("90:30", 5430),
        ("01:00:00", 3600),
        ("2-12", 216000),
        ("2-12:30", 217800),
        ("1-00:00:01", 86401),
        ("UNLIMITED", None),
        ("infinite", None),
        ("0", None),  # sbatch: no limit
    ],
)
def test_slurm_time_limits_read_as_seconds(text: str, seconds: int | None) -> None:
    assert slurm_time_s(text) == seconds


@given(st.integers(0, 30), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_every_form_of_one_limit_reads_the_same(days: int, hours: int, minutes: int, seconds: int) -> None:
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    forms = [f"{days}-{hours}:{minutes:02d}:{seconds:02d}", f"{days * 24 + hours}:{minutes}:{seconds}"]
    if not seconds:
        forms += [f"{days}-{hours}:{minutes}", str((days * 24 + hours) * 60 + minutes)]
    assert {slurm_time_s(f) for f in forms} == {total or None}


@pytest.mark.parametrize(
    ("args", "qos"),
    [([], None), (["--qos=high"], "high"), (["-q", "low", "--mem=0"], "low"), (["-qhi"], "hi")],
)
def test_the_qos_sbatch_args_ask_for(args: list[str], qos: str | None) -> None:
    assert cluster(sbatch_args=args).qos == qos


PARTITIONS = st.builds(
    PartitionLimits,
    name=st.just("gpu"),
    state=st.sampled_from(["UP", "DOWN", "DRAIN", "INACTIVE"]),
    max_time=st.sampled_from(["UNLIMITED", "30:00", "01:00:00", "2-00:00:00"]),
    min_nodes=st.integers(0, 3),
    max_nodes=st.one_of(st.none(), st.integers(0, 3)),
    allow_accounts=st.one_of(st.none(), st.just(("team_a",))),
    deny_accounts=st.sampled_from([(), ("team_b",)]),
    allow_qos=st.one_of(st.none(), st.just(("normal",))),
    deny_qos=st.sampled_from([(), ("high",)]),
)


@given(
    PARTITIONS,
    st.sampled_from(["20", "01:00:00", "3-00:00:00", "UNLIMITED"]),
    st.sampled_from([None, "team_a", "team_b"]),
    st.sampled_from([[], ["--qos=normal"], ["--qos=high"]]),
    st.integers(1, 8),
)
def test_a_job_is_refused_exactly_for_the_limits_it_breaks(
    part: PartitionLimits, time: str, account: str | None, qos: list[str], tp: int
) -> None:
    config = cluster(time=time, account=account, sbatch_args=qos)
    limit, asked = slurm_time_s(part.max_time), slurm_time_s(time)
    breaks = {
        "partition-state": part.state != "UP",
        "partition-time": limit is not None and (asked is None or asked > limit),
        "partition-nodes": part.min_nodes > 1 or part.max_nodes == 0,
        "partition-node-gpus": tp > 4,
        "partition-account": account is not None
        and (
            account in part.deny_accounts
            or (part.allow_accounts is not None and account not in part.allow_accounts)
        ),
        "partition-qos": config.qos is not None
        and (
            config.qos in part.deny_qos or (part.allow_qos is not None and config.qos not in part.allow_qos)
        ),
    }
    refused = partition_refusals(config, tp, part, FOUR_GPUS)
    assert {r.rule for r in refused} == {rule for rule, broken in breaks.items() if broken}
    assert all("cluster." in r.fix or "engine.tp" in r.fix for r in refused)  # each names what to change


def test_an_account_slurm_refuses_in_words_is_a_reason_waiting_does_not_clear() -> None:
    reason = "Job's_account_not_known,_so_it_can't_use_this_partition_(gpu_allows_team_a)"  # Slurm 23's
    assert hopeless_fix(reason) is not None and "cluster.account" in str(hopeless_fix(reason))
    assert hopeless_fix("PartitionTimeLimit") is not None and hopeless_fix("Resources") is None
