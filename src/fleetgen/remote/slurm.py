"""Talking to a Slurm cluster through its own commands (`sbatch`, `scontrol`, `sinfo`, `scancel`, `sacct`),
run as argv on the submit host (a `Host`: this machine or a login node over SSH).

Slurm's answers are parsed here (`scontrol -o` lines, `sinfo` GRES) and its refusals become DeployErrors that
quote Slurm's own message and name the fleet-file field to change.

Also: a partition's GPUs (per node), one short `srun` probe on a node (plan's nvidia-smi), and the
processes on a node that carry a job's `SLURM_JOB_ID` (`job_processes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetgen.config import SlurmCluster
from fleetgen.errors import DeployError
from fleetgen.remote.base import Host, RunResult
from fleetgen.remote.procfs import StatLine

EXPORT = "--export=PATH,HOME,USER,LANG"  # never ALL: fleetgen's environment may hold the API key

# Job states in which the job holds (or waits for) its allocation: anything else has ended.
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED"})
# Pending reasons that never clear by waiting: the job is cancelled and `up` says why.
HOPELESS = {
    "PartitionTimeLimit": "cluster.time is over the partition's MaxTime (`scontrol show partition`)",
    "PartitionNodeLimit": "the partition allows fewer nodes (or GPUs per node) than a server needs",
    "PartitionConfig": "the partition cannot run the job as asked (`scontrol show partition`)",
    "BadConstraints": "no node satisfies the job's constraints: check sbatch_args and engine.tp",
    "InvalidAccount": "set cluster.account to an account you may use (`sacctmgr show assoc user=$USER`)",
    "InvalidQOS": "fix the --qos in cluster.sbatch_args (`sacctmgr show assoc user=$USER`)",
    "AccountNotAllowed": "set cluster.account to an account the partition allows",
    "QOSNotAllowed": "use a QOS the partition allows (cluster.sbatch_args)",
    "PartitionDown": "the partition is down: ask the admins, or set cluster.partition to another",
    "PartitionInactive": "the partition is inactive: ask the admins, or set cluster.partition to another",
}
# A reason Slurm writes as text, not a code: the job's account may not use the partition.
_ACCOUNT_REFUSED = "can't_use_this_partition"


def hopeless_fix(reason: str) -> str | None:
    """The fix of a pending reason that waiting does not clear; None for one that may clear."""
    if _ACCOUNT_REFUSED in reason:
        return HOPELESS["AccountNotAllowed"]
    return HOPELESS.get(reason)


# Slurm's refusal texts (sbatch / allocation failure) → which field fixes them.
_FIXES = (
    ("invalid partition", "set cluster.partition to one `sinfo -s` lists"),
    ("time limit", "lower cluster.time to at most the partition's MaxTime (`sinfo -o '%P %l'`)"),
    (
        "node configuration is not available",
        "no node has the GPUs one server asks for (engine.tp, `--gres=gpu:<tp>`) in this partition: "
        "lower engine.tp or pick a partition with larger nodes (`sinfo -o '%P %G'`)",
    ),
    ("invalid account", HOPELESS["InvalidAccount"]),
    ("qos", HOPELESS["InvalidQOS"]),
    ("unrecognized option", "remove the option from cluster.sbatch_args (`sbatch --help` lists them)"),
    ("invalid option", "remove the option from cluster.sbatch_args (`sbatch --help` lists them)"),
)


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job as `scontrol show job` (or `sacct`) reports it."""

    job_id: str
    state: str  # PENDING, RUNNING, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, COMPLETED, FAILED, …
    reason: str = ""  # "None" is written as ""
    nodes: str = ""  # the allocated node(s) (batch host first), "" while pending
    run_time: str = ""
    exit_code: str = ""
    name: str = ""

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE

    @property
    def node(self) -> str:
        """The node the batch script runs on (one node per job here)."""
        return self.nodes.split(",", 1)[0]

    def describe(self) -> str:
        """`CANCELLED (reason)`, Slurm's own words."""
        why = f" ({self.reason})" if self.reason else ""
        code = f", exit {self.exit_code}" if self.exit_code not in ("0:0", "") else ""
        return f"{self.state}{why}{code}"


_FIELD = re.compile(r"(?:^|\s)(JobId|JobName|JobState|Reason|BatchHost|NodeList|RunTime|ExitCode)=(\S*)")
_NONE = ("None", "(null)", "None_assigned", "None assigned")  # how scontrol and sacct write "none"


def _job(job: str, state: str, reason: str, nodes: str, run_time: str, code: str, name: str) -> JobInfo:
    reason, nodes = ("" if v in _NONE else v for v in (reason, nodes))
    return JobInfo(job, state or "UNKNOWN", reason, nodes, run_time, code, name)


def parse_jobs(text: str) -> dict[str, JobInfo]:
    """`scontrol show job -o` output (one job per line) → JobInfo by job id."""
    rows = (dict(_FIELD.findall(line)) for line in text.splitlines())
    return {
        f["JobId"]: _job(
            f["JobId"],
            f.get("JobState", ""),
            f.get("Reason", ""),
            f.get("BatchHost") or f.get("NodeList", ""),
            f.get("RunTime", ""),
            f.get("ExitCode", ""),
            f.get("JobName", ""),
        )
        for f in rows
        if "JobId" in f
    }


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """`sacct -n -P -X -o JobID,State,Reason,NodeList,Elapsed,ExitCode,JobName` → JobInfo by job id."""
    rows = (line.split("|") for line in text.splitlines())
    # the state's first word: "CANCELLED by 0"
    return {r[0]: _job(r[0], r[1].split()[0] if r[1] else "", *r[2:7]) for r in rows if len(r) >= 7}


def slurm_message(result: RunResult) -> str:
    """Slurm's own words from a failed command's stderr (its `error:` lines, else the last line)."""
    lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "failure" in ln.lower()]
    return "; ".join(errors or lines[-1:]) or f"exit code {result.exit_status}"


def fix_for(message: str) -> str:
    """The fleet-file change that answers one of Slurm's refusals."""
    low = message.lower()
    for needle, fix in _FIXES:
        if needle in low:
            return fix
    return (
        "read Slurm's message above; the [cluster] table (partition, time, account, sbatch_args) sets the job"
    )


def job_options(cluster: SlurmCluster, *options: str) -> list[str]:
    """Options of every job fleetgen asks for: one task on one node of the cluster's partition, billed to its
    account, only EXPORT's variables; then `options`, and the user's sbatch_args last (theirs win)."""
    account = [f"--account={cluster.account}"] if cluster.account else []
    partition = f"--partition={cluster.partition}"
    return [partition, "--nodes=1", "--ntasks=1", EXPORT, *account, *options, *cluster.sbatch_args]


async def slurm(host: Host, argv: Sequence[str], what: str) -> RunResult:
    """Run a Slurm command; a refusal raises DeployError quoting Slurm and naming the fix."""
    result = await host.run(argv, check=False, timeout=120.0)
    if result.exit_status == 127:
        raise DeployError(
            f"{argv[0]} is not found on {host.name}: fleetgen submits through Slurm's own commands",
            fix="run fleetgen where Slurm's client commands work (a login node), or set cluster.submit to "
            "one (`user@login:22`)",
            context={"host": host.name},
        )
    if result.exit_status != 0:
        message = slurm_message(result)
        raise DeployError(
            f"Slurm refused to {what}: {message}",
            fix=fix_for(message),
            context={"host": host.name, "argv": " ".join(argv)},
        )
    return result


async def jobs(host: Host, ids: Iterable[str]) -> dict[str, JobInfo]:
    """The state of each job; from `scontrol` while Slurm remembers it, else `sacct`; a job neither knows
    is reported as state UNKNOWN with why."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    shown = await host.run(["scontrol", "show", "job", "-o"], check=False, timeout=60.0)
    found = {k: v for k, v in parse_jobs(shown.stdout).items() if k in wanted}
    missing = [j for j in wanted if j not in found]
    if missing:
        fields = "JobID,State,Reason,NodeList,Elapsed,ExitCode,JobName"
        acct = await host.run(
            ["sacct", "-n", "-P", "-X", "-o", fields, "-j", ",".join(missing)], check=False, timeout=60.0
        )
        found.update({k: v for k, v in parse_sacct(acct.stdout).items() if k in missing})
        why = slurm_message(acct) if acct.exit_status != 0 else "sacct does not list it"
        for job in missing:
            found.setdefault(job, JobInfo(job, "UNKNOWN", f"Slurm no longer lists it ({why})"))
    return found


async def queued(host: Host, names: Sequence[str]) -> dict[str, str]:
    """Job id → job name of every job with one of `names` that Slurm still queues or runs."""
    if not names:
        return {}
    result = await slurm(host, ["squeue", "-h", "--name", ",".join(names), "-o", "%i|%j"], "list the jobs")
    rows = (line.split("|", 1) for line in result.stdout.splitlines() if "|" in line)
    return {job: name for job, name in rows if name in names}


async def cancel(host: Host, names: Sequence[str]) -> None:
    """`scancel --name` each: every job fleetgen gave that name, whatever fleetgen's state recorded."""
    for name in names:
        await slurm(host, ["scancel", "--name", name], f"cancel job {name}")


async def job_processes(host: Host, job: str) -> list[StatLine]:
    """The live processes on `host` (a node) that Slurm job `job` started: every process of a job inherits
    SLURM_JOB_ID and keeps it when its parent dies and it is reparented to init (out of the job's process
    group and, under proctrack/linuxproc, of Slurm's sight); slurmstepd itself does not carry it."""
    return await host.marked_processes("SLURM_JOB_ID", job)


@dataclass(frozen=True)
class PartitionGpus:
    """The GPUs a partition has in all, and sinfo's lines they were counted from."""

    total: int
    lines: tuple[str, ...]
    per_node: tuple[tuple[str, int], ...] = ()  # (node, its GPUs) for the nodes that can run jobs


_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


async def partition_gpus(host: Host, partition: str) -> PartitionGpus:
    """Sum of `gpu` GRES over the partition's nodes that can run jobs (not down, drained or failed)."""
    result = await slurm(
        host, ["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%G|%t"], f"describe partition {partition}"
    )
    return parse_partition_gpus(result.stdout)


def parse_partition_gpus(text: str) -> PartitionGpus:
    """`sinfo -h -N -o '%N|%G|%t'` → the GPUs of the nodes that can run jobs, and the lines counted."""
    per_node: dict[str, int] = {}
    lines = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 3:
            continue
        node, gres, state = parts
        lines.append(f"{node} {gres} {state}")
        if not state.rstrip("*~#!%$@^-").startswith(("down", "drain", "fail", "inval")):
            per_node[node] = sum(int(n) for n in _GPU_GRES.findall(gres))
    return PartitionGpus(sum(per_node.values()), tuple(lines), tuple(per_node.items()))


async def node_address(host: Host, node: str) -> str:
    """The address Slurm reaches a node at (NodeAddr), for SSH to it."""
    result = await slurm(host, ["scontrol", "show", "node", "-o", node], f"describe node {node}")
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", result.stdout)
    return match.group(1) if match else node


PROBE_MINUTES = 5  # the GPU probe's time limit: one nvidia-smi, never near it
PROBE_WAIT_S = 120  # `srun --immediate`: how long the probe waits for a free GPU before giving up
_EXIT_NO_NVIDIA_SMI = 69
# On the node: its name, then the query (`nvidia-smi …`) where it exists, else exit 69.
_PROBE_SH = (
    'echo "node=${SLURMD_NODENAME:-$(hostname)}"; command -v "$1" >/dev/null 2>&1 || exit 69; exec "$@"'
)
_NO_PROBE_FIX = "or plan with --offline and cluster.gpu_memory_gib set in the fleet file"


@dataclass(frozen=True)
class NodeAnswer:
    """What one short job step printed on a node of the partition."""

    node: str
    stdout: str


async def probe_node(host: Host, cluster: SlurmCluster, query: Sequence[str]) -> NodeAnswer:
    """One short `srun` in the cluster's partition holding one GPU (the fleet's account and sbatch_args,
    `--time` PROBE_MINUTES) runs `query` there; Slurm's refusal, or the node lacking `query[0]`, raises
    DeployError in their words with the fix."""
    probe = [f"--time={PROBE_MINUTES}", "--gres=gpu:1", f"--immediate={PROBE_WAIT_S}"]
    options = job_options(cluster, *probe, "--job-name=fleetgen-plan-probe")
    argv = ["srun", *options, "--quiet", "--", "sh", "-c", _PROBE_SH, "fleetgen", *query]
    result = await host.run(argv, check=False, timeout=PROBE_WAIT_S + 60.0)
    node = next((ln[5:] for ln in result.stdout.splitlines() if ln.startswith("node=")), "")
    if result.exit_status == _EXIT_NO_NVIDIA_SMI and node:
        raise DeployError(
            f"{query[0]} is not found on node {node} (partition {cluster.partition}, in the PATH a Slurm job "
            "step has there), so plan cannot read the GPUs' memory",
            fix=f"install the NVIDIA driver tools on the partition's nodes, {_NO_PROBE_FIX}",
            context={"host": host.name, "node": node},
        )
    if result.exit_status == 127 and not node:
        await slurm(host, ["srun", "--version"], "run srun")  # not found → says so, with its fix
    if result.exit_status != 0:
        message = slurm_message(result)
        if node:  # the step ran: the node's own tool failed
            what, fix = f"{query[0]} failed on node {node}", f"run {query[0]} on {node} to see why"
        else:
            what, fix = f"Slurm refused the GPU probe in partition {cluster.partition}", fix_for(message)
        raise DeployError(
            f"{what}: {message}",
            fix=f"{fix}; {_NO_PROBE_FIX}",
            context={"host": host.name, "argv": " ".join(argv[: argv.index("--")])},
        )
    return NodeAnswer(node, "\n".join(ln for ln in result.stdout.splitlines() if not ln.startswith("node=")))
