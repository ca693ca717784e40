"""A Slurm partition's limits as `scontrol show partition` reports them, and which of them a fleet's jobs
break: checked by fleetgen itself before anything is queued.

Why not leave it to `sbatch --test-only`: it refuses a job over a partition limit only where the cluster sets
`EnforcePartLimits`; Slurm's default (NO) accepts the job, which then pends for ever (PartitionTimeLimit,
PartitionNodeLimit, an account the partition does not allow). So every limit fleetgen can read is compared
here with what each server's job asks for; what it cannot read (accounting's associations, QOS limits) is
left to Slurm's own answer.

The limits read: state, MaxTime, Min/MaxNodes, allowed/denied accounts and QOS, with the GPUs per node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetgen.config import SlurmCluster
from fleetgen.config.slurm import slurm_time_s
from fleetgen.plan import Issue
from fleetgen.remote.base import Host
from fleetgen.remote.slurm import PartitionGpus, slurm

_OTHER_PARTITION = "or set cluster.partition to another (`sinfo -s` lists them)"


@dataclass(frozen=True)
class PartitionLimits:
    """The limits of one partition a job of fleetgen's can break. A `None` list allows everyone (ALL)."""

    name: str
    state: str = "UP"  # UP, DOWN, DRAIN, INACTIVE
    max_time: str = "UNLIMITED"  # as Slurm writes it
    min_nodes: int = 0
    max_nodes: int | None = None  # None: UNLIMITED
    allow_accounts: tuple[str, ...] | None = None
    deny_accounts: tuple[str, ...] = ()
    allow_qos: tuple[str, ...] | None = None
    deny_qos: tuple[str, ...] = ()


def _names(value: str | None) -> tuple[str, ...] | None:
    """`a,b` → ("a", "b"); ALL (or absent) → None."""
    if value is None or value.upper() == "ALL":
        return None
    return tuple(v for v in value.split(",") if v)


def _count(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def parse_partition(text: str) -> PartitionLimits | None:
    """`scontrol show partition -o NAME` (one line of KEY=VALUE) → its limits; None when no line names one."""
    for line in text.splitlines():
        fields: Mapping[str, str] = dict(t.partition("=")[::2] for t in line.split() if "=" in t)
        if "PartitionName" not in fields:
            continue
        return PartitionLimits(
            name=fields["PartitionName"],
            state=fields.get("State", "UP"),
            max_time=fields.get("MaxTime", "UNLIMITED"),
            min_nodes=_count(fields.get("MinNodes", "0")) or 0,
            max_nodes=_count(fields.get("MaxNodes", "UNLIMITED")),
            allow_accounts=_names(fields.get("AllowAccounts")),
            deny_accounts=_names(fields.get("DenyAccounts")) or (),
            allow_qos=_names(fields.get("AllowQos")),
            deny_qos=_names(fields.get("DenyQos")) or (),
        )
    return None


async def partition_limits(host: Host, partition: str) -> PartitionLimits | None:
    """The partition's limits; None when Slurm knows no such partition (`sbatch --test-only` then says so
    in Slurm's words, with its fix)."""
    argv = ["scontrol", "show", "partition", "-o", partition]
    result = await host.run(argv, check=False, timeout=60.0)
    if result.exit_status != 0 and "not found" in (result.stdout + result.stderr).lower():
        return None
    if result.exit_status != 0:
        result = await slurm(host, argv, f"describe partition {partition}")  # raises in Slurm's words
    return parse_partition(result.stdout)


def _is_refused(name: str, allow: tuple[str, ...] | None, deny: tuple[str, ...]) -> bool:
    return name in deny or (allow is not None and name not in allow)


def partition_refusals(
    cluster: SlurmCluster, gpus_per_server: int, part: PartitionLimits, have: PartitionGpus
) -> list[Issue]:
    """What in one server's job (`cluster`'s time, account and QOS; one node with `gpus_per_server` GPUs)
    the partition's limits refuse, each with the fleet-file change that answers it."""
    refused = []
    if part.state.upper() != "UP":
        refused.append(
            Issue(
                "partition-state",
                f"partition {part.name} is {part.state}: it runs no new job",
                f"ask the cluster's admins, {_OTHER_PARTITION}",
            )
        )
    limit_s, asked_s = slurm_time_s(part.max_time), cluster.time_limit_s
    if limit_s is not None and (asked_s is None or asked_s > limit_s):
        refused.append(
            Issue(
                "partition-time",
                f"cluster.time = {cluster.time} is over partition {part.name}'s MaxTime {part.max_time}",
                f"lower cluster.time to at most {part.max_time}, {_OTHER_PARTITION}",
            )
        )
    if part.min_nodes > 1 or part.max_nodes == 0:
        allowed = f"MinNodes {part.min_nodes}, MaxNodes {part.max_nodes}"
        refused.append(
            Issue(
                "partition-nodes",
                f"partition {part.name} runs no single-node job ({allowed}): a server is one job on one node",
                "set cluster.partition to one that runs single-node jobs (`scontrol show partition`)",
            )
        )
    widest = max((gpus for _, gpus in have.per_node), default=None)
    if widest is not None and gpus_per_server > widest:
        refused.append(
            Issue(
                "partition-node-gpus",
                f"a server needs {gpus_per_server} GPUs on one node (engine.tp), but partition {part.name}'s "
                f"nodes have at most {widest} (sinfo: {'; '.join(have.lines)})",
                f"lower engine.tp to at most {widest}, {_OTHER_PARTITION} with larger nodes",
            )
        )
    if cluster.account and _is_refused(cluster.account, part.allow_accounts, part.deny_accounts):
        refused.append(_not_allowed(part, "account", cluster.account, part.allow_accounts, "cluster.account"))
    if cluster.qos and _is_refused(cluster.qos, part.allow_qos, part.deny_qos):
        refused.append(
            _not_allowed(part, "QOS", cluster.qos, part.allow_qos, "the --qos in cluster.sbatch_args")
        )
    return refused


def _not_allowed(
    part: PartitionLimits, what: str, name: str, allow: tuple[str, ...] | None, field: str
) -> Issue:
    allowed = f"it allows {', '.join(allow)}" if allow is not None else "it denies it"
    return Issue(
        f"partition-{what.lower()}",
        f"partition {part.name} does not let {what} {name} run jobs ({allowed})",
        f"set {field} to one partition {part.name} allows, {_OTHER_PARTITION}",
    )
