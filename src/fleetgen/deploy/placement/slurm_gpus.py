"""A Slurm cluster's GPUs as fleetgen plans on them: the partition's (`sinfo`) against `cluster.gpus`
(`gpus_shortfall`: `up`'s preflight refuses it, `plan` warns), and the GPU one short `srun` sees
(`cluster_gpus`: what `plan` online sizes every server on)."""

from __future__ import annotations

from dataclasses import replace

from fleetgen.config import HostEntry, SlurmCluster
from fleetgen.deploy.hostsurvey import GPU_QUERY, parse_gpu_csv
from fleetgen.errors import RemoteError
from fleetgen.plan import GpuFacts, Issue
from fleetgen.remote import open_host
from fleetgen.remote.slurm import PartitionGpus, partition_gpus, probe_node


def gpus_shortfall(cluster: SlurmCluster, have: PartitionGpus) -> Issue | None:
    """`cluster.gpus` over the GPUs the partition has (`up` refuses it, `plan` warns)."""
    if cluster.gpus <= have.total:
        return None
    return Issue(
        "cluster-gpus",
        f"cluster.gpus = {cluster.gpus}, but partition {cluster.partition} has {have.total} GPU(s) on nodes "
        f"that can run jobs (sinfo: {'; '.join(have.lines) or 'no nodes'})",
        f"set cluster.gpus to at most {have.total} in the fleet file, or pick a larger partition",
    )


async def cluster_gpus(
    submit: HostEntry, cluster: SlurmCluster, tp: int
) -> tuple[tuple[GpuFacts, ...], list[Issue]]:
    """A Slurm fleet's GPUs, online: the partition's GRES per node (`sinfo`), and one short `srun` holding
    one GPU runs nvidia-smi; every slot of `cluster.gpus` is planned as that GPU (a GPU Slurm hands out is
    free of other jobs, so the probe's emptiest GPU is what a server gets). Slurm's refusals raise."""
    async with open_host(submit) as conn:
        have = await partition_gpus(conn, cluster.partition)
        answer = await probe_node(conn, cluster, GPU_QUERY)
    rows = parse_gpu_csv(answer.stdout)
    if not rows:
        raise RemoteError(
            f"nvidia-smi on node {answer.node} (partition {cluster.partition}) listed no GPU: "
            f"{answer.stdout.strip()[:200] or 'no output'}",
            fix=f"check the node's driver (nvidia-smi on {answer.node}), or plan with --offline and "
            "cluster.gpu_memory_gib set in the fleet file",
        )
    best = max(rows, key=lambda g: g.memory_total_mib - g.memory_used_mib).facts()
    notes = [short] if (short := gpus_shortfall(cluster, have)) else []
    widest = max((n for _, n in have.per_node), default=0)
    if tp > widest:
        text = f"engine.tp = {tp}, but no node of partition {cluster.partition} has over {widest} GPU(s)"
        fix = "lower engine.tp, or pick a partition with larger nodes (`sinfo -o '%P %G'`)"
        notes.append(Issue("cluster-gpus", text, fix))
    return tuple(replace(best, index=i) for i in range(cluster.gpus)), notes
