"""Servers placed by a Slurm cluster (`[cluster] kind = "slurm"`): one batch job per server.

Why one job per server, not one job with a step per server: each server then has its own time limit, its
own `scancel`, its own place in the queue and its own end (a preemption or a node failure ends one server,
not the fleet), and a restart resubmits one job while the others keep serving. A multi-GPU server is one job
on one node (`--nodes=1 --gres=gpu:<tp>`).

The job's batch script is a constant (`JOB_SH`): it creates the launch's new log (0600), writes the pidfile
and `exec`s the SAME rendered `launch.sh` SSH hosts run, so the job's batch process *is* the engine. Values
reach it as arguments; no secret is in the script, its argv or the environment Slurm stores (`--export`
names only PATH, HOME, USER, LANG; the key travels in 0600 files as for SSH hosts). Once Slurm allocated the
job, the node is opened as a host (this machine, or SSH to its NodeAddr: `cluster.node_access`) and the
verification chain of SSH hosts runs unchanged (`deploy.instance.follow_launch` / `keep_running`).
The workdir is on the filesystem the submit host and the nodes share.

Preflight, before anything is queued: the partition's limits (`remote.partition`), `cluster.gpus` over the
partition's (`gpus_shortfall`, `plan`'s warning too), then `sbatch --test-only`. Waiting for the allocation:
a pending reason that does not clear cancels the job once it held a few seconds (Slurm replaces its first,
generic one). `down` ends the jobs by name; `down` and restart then sweep what an ended job left on its node
(its process group, and every process carrying its `SLURM_JOB_ID`, through `Host.stop` as for SSH hosts,
leader gone or not). `place` says where each instance is now, for `status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from fleetgen.config import FleetFile, HostEntry, Instance, SlurmCluster
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.instance import (
    find_running,
    follow_launch,
    keep_running,
    push_launch,
    remove_secret_files,
)
from fleetgen.deploy.placement.base import Offered, Placed
from fleetgen.deploy.placement.launched import engine_pid, job_script, placement_name
from fleetgen.deploy.placement.slurm_gpus import cluster_gpus, gpus_shortfall
from fleetgen.deploy.session import HostSession, is_loopback, open_session
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.types import (
    Action,
    InstanceCommand,
    Narrate,
    Outcome,
    Rollout,
    Say,
    WantedInstance,
    settle,
)
from fleetgen.deploy.verify import process_drift
from fleetgen.errors import DeployError, LaunchFailed
from fleetgen.remote.base import Host
from fleetgen.remote.partition import partition_limits, partition_refusals
from fleetgen.remote.slurm import (
    JobInfo,
    cancel,
    hopeless_fix,
    job_options,
    job_processes,
    jobs,
    node_address,
    partition_gpus,
    queued,
    slurm,
)
from fleetgen.remote.srun import SrunHost

JOB_SCRIPT = "slurm-job.sh"

JOB_SH = job_script(
    "Slurm job ${SLURM_JOB_ID:-?}",
    head="#!/bin/sh\n# fleetgen: one Slurm job = one server; rewritten by `fleetgen up`, do not edit.\n",
)
REASON_SETTLE_S = 5.0  # a pending reason that waiting does not clear is judged once it held this long


def job_name(fleet_path: Path, instance: str) -> str:
    """The Slurm job name of an instance: unique per fleet file, so `down` finds every job of ours."""
    return placement_name("fleetgen", fleet_path, instance)


def sbatch_argv(cluster: SlurmCluster, wanted: WantedInstance, name: str, tail: Sequence[str]) -> list[str]:
    """sbatch's argv for one server; `tail`: the batch script and its arguments (or `--wrap=true`)."""
    gres, chdir = f"--gres=gpu:{len(wanted.inst.gpus)}", f"--chdir={wanted.command.paths.root}"
    output = "--output=/dev/null"  # the batch script writes the launch's own log
    options = job_options(cluster, f"--job-name={name}", f"--time={cluster.time}", gres, output, chdir)
    return ["sbatch", "--parsable", *options, *tail]


async def preflight(login: HostSession, cluster: SlurmCluster, wanted: WantedInstance) -> None:
    """Before any job is queued, whatever the cluster's `EnforcePartLimits`: the partition's limits that
    fleetgen can read (state, MaxTime, nodes, GPUs per node, accounts, QOS) and the GPUs it has, checked
    here; then Slurm accepts one server's job (`sbatch --test-only`: what fleetgen cannot read)."""
    host = login.host
    if (part := await partition_limits(host, cluster.partition)) is not None:
        have = await partition_gpus(host, cluster.partition)
        refused = partition_refusals(cluster, len(wanted.inst.gpus), part, have)
        refused += [short] if (short := gpus_shortfall(cluster, have)) else []
        if refused:
            raise DeployError(
                "; ".join(r.message for r in refused) + " (checked before anything was queued)",
                fix="; ".join(r.fix for r in refused),
            )
    test = sbatch_argv(cluster, wanted, "fleetgen-test-only", ["--wrap=true"])
    test.insert(1, "--test-only")
    await slurm(host, test, "accept a server's job")


async def wait_running(host: Host, job: str, instance: str, progress: Narrate, timeout_s: float) -> JobInfo:
    """Poll the job until Slurm runs it (its node known); progress names the pending reason and time. A
    reason that waiting does not clear cancels the job once it held REASON_SETTLE_S: Slurm first writes a
    generic one (PartitionConfig) and replaces it with the precise one (PartitionTimeLimit) a moment later."""
    started, delay = time.monotonic(), 0.2
    said: tuple[tuple[str, str], float] = (("", ""), 0.0)
    hopeless_since: float | None = None
    while True:
        info = (await jobs(host, [job]))[job]
        elapsed = time.monotonic() - started
        if info.state == "RUNNING" and info.node:
            progress(instance, f"Slurm job {job} runs on {info.node} after {elapsed:.0f} s in the queue")
            return info
        if not info.is_active:
            raise LaunchFailed(
                f"{instance}: Slurm job {job} ended before it ran: {info.describe()}",
                fix=f"`scontrol show job {job}` says more; `fleetgen up` submits it again",
            )
        fix = hopeless_fix(info.reason)
        if fix is None:
            hopeless_since = None
        elif hopeless_since is None:
            hopeless_since = elapsed
        elif elapsed - hopeless_since >= REASON_SETTLE_S:
            await cancel(host, [info.name])
            raise DeployError(
                f"{instance}: Slurm keeps job {job} pending for a reason that waiting does not clear: "
                f"{info.reason}; the job was cancelled",
                fix=fix,
            )
        if elapsed > timeout_s:
            raise DeployError(
                f"{instance}: Slurm job {job} still {info.state.lower()} ({info.reason}) after "
                f"{elapsed:.0f} s",
                fix="it stays queued: `fleetgen up` again takes it over once it runs (or raise "
                "cluster.pending_timeout_s); `fleetgen down` cancels it",
            )
        if (info.state, info.reason) != said[0] or elapsed - said[1] >= 30:
            progress(instance, f"Slurm job {job} {info.state.lower()}: {info.reason or '-'}, {elapsed:.0f} s")
            said = ((info.state, info.reason), elapsed)
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 5.0)


@contextlib.asynccontextmanager
async def node_session(fleet: Fleet, login: HostSession, node: str, job: str) -> AsyncIterator[HostSession]:
    """The allocated node as a host: this machine (`node_access = "local"`), SSH to its NodeAddr ("ssh"),
    or steps of the job itself through `srun --overlap --jobid` ("srun")."""
    cluster = _cluster(fleet)
    values: dict[str, object] = {"name": login.entry.name, "workdir": login.survey.workdir}
    srun: SrunHost | None = None
    address = await node_address(login.host, node) if cluster.node_access != "local" else ""
    if cluster.node_access == "ssh":
        user = f"{cluster.node_ssh_user}@" if cluster.node_ssh_user else ""
        ssh = f"{user}{address}:{cluster.node_ssh_port}"
        values |= {"ssh": ssh, "identity": cluster.identity, "known_hosts": cluster.known_hosts}
    elif cluster.node_access == "srun":
        values["ssh"] = address  # where a public bind is reached; srun runs the commands
        here = login.entry.is_local and is_loopback(address)
        srun = SrunHost(login.entry.name, login.host, job, is_here=here)
    entry = HostEntry.model_validate({k: v for k, v in values.items() if v is not None})
    async with open_session(entry, fleet.file.engine, login.http, check_launch=False, host=srun) as hs:
        yield hs


async def up_jobs(
    fleet: Fleet, login: HostSession, all_wanted: Sequence[WantedInstance], run: Rollout
) -> list[Outcome]:
    """`up` of a cluster's servers (after `preflight`): each server's job kept, taken over (pending) or
    (re)submitted, and every one verified like an SSH host's."""
    return await settle(login.entry.name, all_wanted, partial(_ensure, fleet, login, run))


async def _ensure(
    fleet: Fleet, login: HostSession, run: Rollout, wanted: WantedInstance, out: Outcome
) -> None:
    name = wanted.inst.name
    record = run.records.get(name)
    job = record.placement_id if record is not None else ""
    info = (await jobs(login.host, [job]))[job] if job else None
    if record is not None and info is not None and info.is_active and not run.force:
        if record.pid and info.state == "RUNNING":
            async with node_session(fleet, login, info.node, info.job_id) as node:
                running = await find_running(node, wanted, record)
                if running and not process_drift(wanted.command, running, wanted.secret_value):
                    await keep_running(node, wanted, run, out, running)
                    return
        elif record.script_sha256 == wanted.sha256:  # queued by an earlier `up`: take it over
            run.progress(name, f"Slurm job {job} is already queued for it: waiting for it")
            out.action = Action.STARTED
            await _follow(fleet, login, wanted, record, out, run)
            return
    jname = job_name(fleet.path, name)
    old = await queued(login.host, [jname])
    if old:
        why = "restart" if run.force else "flags or env changed, or its process is gone"
        run.progress(name, f"cancelling Slurm job {', '.join(old)} ({why})")
        await cancel_jobs(login, [jname])
    out.swept = await _sweep(fleet, login, record)  # its job ended but processes live: port, GPU
    if out.swept:
        run.progress(name, f"swept pid(s) {', '.join(map(str, out.swept))}, left on its node by an ended job")
    out.action = Action.REPLACED if old else Action.STARTED
    rec = await _submit(fleet, login, wanted, run.progress)
    run.on_record(rec)
    await _follow(fleet, login, wanted, rec, out, run)


async def _submit(
    fleet: Fleet, login: HostSession, wanted: WantedInstance, progress: Narrate
) -> InstanceRecord:
    """Push the key files, launch.sh and the job script (verified), then sbatch; the record names the job."""
    paths, host = wanted.command.paths, login.host
    log = await push_launch(host, wanted)
    job_script = posixpath.join(paths.root, JOB_SCRIPT)
    await host.put(job_script, JOB_SH.encode(), mode=0o700)
    await host.run(["rm", "-f", "--", paths.pidfile])  # the job writes its own: an old one must not count
    name = job_name(fleet.path, wanted.inst.name)
    argv = sbatch_argv(_cluster(fleet), wanted, name, [job_script, paths.script, log, paths.pidfile])
    queued_as = await slurm(host, argv, "queue the server")
    job = queued_as.stdout.strip().split(";", 1)[0]  # --parsable: id[;cluster]
    progress(wanted.inst.name, f"submitted Slurm job {job} ({name}), log {log}")
    return wanted.record(login.entry.name, log, placement_id=job)


async def _follow(
    fleet: Fleet, login: HostSession, wanted: WantedInstance, rec: InstanceRecord, out: Outcome, run: Rollout
) -> None:
    """Wait for the allocation, learn node and PID, then the SSH hosts' chain: ready, listener, verify."""
    timeout_s = _cluster(fleet).pending_timeout_s
    info = await wait_running(login.host, rec.placement_id, wanted.inst.name, run.progress, timeout_s)
    undo = partial(cancel, login.host, [job_name(fleet.path, wanted.inst.name)])
    async with node_session(fleet, login, info.node, info.job_id) as node:
        pid, start_time = await _engine_pid(node, wanted, rec.placement_id)
        rec = replace(rec, pid=pid, start_time=start_time, node=info.node)
        await follow_launch(node, wanted, rec, run, out, undo=undo)


async def _engine_pid(node: HostSession, wanted: WantedInstance, job: str) -> tuple[int, int]:
    """The engine's PID and start time on the node: the process carries the job's SLURM_JOB_ID."""
    fix = (
        f"read the job's log in {wanted.command.paths.logs}; is the workdir on a filesystem the nodes share "
        "with the submit host?"
    )
    return await engine_pid(node, wanted, ("SLURM_JOB_ID", job), f"Slurm job {job} runs", fix)


async def cancel_jobs(login: HostSession, names: Sequence[str], timeout_s: float = 60.0) -> None:
    """scancel the jobs with these names, then wait until Slurm lists none; raise naming what stays."""
    await cancel(login.host, names)
    deadline = time.monotonic() + timeout_s
    while left := await queued(login.host, names):
        if time.monotonic() > deadline:
            raise DeployError(
                f"Slurm still lists job(s) {', '.join(left)} {timeout_s:.0f} s after scancel",
                fix=f"look at them: `scontrol show job {' '.join(left)}` (a node may be unresponsive)",
            )
        await asyncio.sleep(0.3)


async def down_jobs(
    fleet: Fleet, login: HostSession, targets: Sequence[InstanceCommand], records: dict[str, InstanceRecord]
) -> list[Outcome]:
    """`down`: scancel every job of ours (by name, whatever the state file says), wait until Slurm lists
    none, then sweep on the node what the job left there (`_sweep`)."""
    names = [job_name(fleet.path, t.inst.name) for t in targets]
    before = set((await queued(login.host, names)).values())
    await cancel_jobs(login, names)

    async def sweep(target: InstanceCommand, out: Outcome) -> None:
        await remove_secret_files(login.host, target.command)
        out.swept = await _sweep(fleet, login, records.get(target.inst.name))
        was_queued = job_name(fleet.path, target.inst.name) in before
        out.action = Action.STOPPED if was_queued or out.swept else Action.ABSENT

    return await settle(login.entry.name, targets, sweep)


async def _sweep(fleet: Fleet, login: HostSession, rec: InstanceRecord | None) -> list[int]:
    """What the recorded launch left alive on its node after its job is gone, stopped as SSH hosts stop a
    server (each process group, TERM then KILL): the engine's group, and every process that carries the
    job's SLURM_JOB_ID (helpers that Slurm's process tracking lost when their parent died and they were
    reparented to init, in a group or session of their own, whatever the proctrack). Returns their PIDs.
    Called once Slurm lists the job no more: nothing of it may run then."""
    if rec is None or not rec.node or not rec.placement_id or _cluster(fleet).node_access == "srun":
        return []  # through srun, nothing runs on the node outside a job: Slurm ended its steps with it
    async with node_session(fleet, login, rec.node, rec.placement_id) as node:
        host = node.host
        swept = await host.stop(rec.pid, start_time=rec.start_time, timeout=10.0) if rec.pid else []
        left = await job_processes(host, rec.placement_id)
        more = await asyncio.gather(*(host.stop(p.pid, start_time=p.start_time, timeout=10.0) for p in left))
        return sorted({*swept, *(pid for pids in more for pid in pids)})


async def place(
    fleet: Fleet,
    login: HostSession,
    instances: Sequence[Instance],
    records: dict[str, InstanceRecord],
    stack: contextlib.AsyncExitStack,
) -> list[Placed]:
    """Each instance's job as Slurm reports it now; running ones get their node opened (on `stack`)."""
    job_of = {i.name: records[i.name].placement_id for i in instances if i.name in records}
    infos = await jobs(login.host, [j for j in job_of.values() if j])
    nodes: dict[str, HostSession] = {}
    placed = []
    for inst in instances:
        info = infos.get(job_of.get(inst.name, ""))
        if info is None:
            placed.append(Placed(inst, None, "no Slurm job: `fleetgen up` submits one", has_ended=True))
        elif info.state == "RUNNING" and info.node:
            key = info.job_id if _cluster(fleet).node_access == "srun" else info.node  # a session per job
            if key not in nodes:
                session = node_session(fleet, login, info.node, info.job_id)
                nodes[key] = await stack.enter_async_context(session)
            where = f"Slurm job {info.job_id} on {info.node}"
            placed.append(Placed(inst, nodes[key], where, placement_id=info.job_id))
        elif info.is_active:
            where = f"Slurm job {info.job_id} {info.describe()}, {info.run_time}"
            placed.append(Placed(inst, None, where))
        else:
            where = f"Slurm job {info.job_id} ended: {info.describe()}"
            placed.append(Placed(inst, None, where, has_ended=True))
    return placed


def _cluster(fleet: Fleet) -> SlurmCluster:
    assert isinstance(fleet.file.cluster, SlurmCluster)  # the registry: Slurm fleets only
    return fleet.file.cluster


class SlurmPlacement:
    """`[cluster] kind = "slurm"`: one batch job per server (this module)."""

    kind = "slurm"
    label = "a Slurm cluster"
    can_tune = False
    is_per_instance = True
    launches_on_login = True  # the submit host: its job steps run the same files

    async def launch_survey(self, fleet: Fleet, login: HostSession, say: Say) -> HostSurvey:
        return login.survey  # its servers launch where `login` stands (or on nodes that share its files)

    async def preflight(self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance]) -> None:
        """Slurm checked before anything is queued (`preflight`): nothing queued if it refuses."""
        if wanted:
            await preflight(login, _cluster(fleet), wanted[0])

    async def up(
        self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance], run: Rollout
    ) -> list[Outcome]:
        return await up_jobs(fleet, login, wanted, run)

    async def down(
        self,
        fleet: Fleet,
        login: HostSession,
        targets: Sequence[InstanceCommand],
        records: dict[str, InstanceRecord],
    ) -> list[Outcome]:
        return await down_jobs(fleet, login, targets, records)

    async def place(
        self,
        fleet: Fleet,
        login: HostSession,
        instances: Sequence[Instance],
        records: dict[str, InstanceRecord],
        stack: contextlib.AsyncExitStack,
    ) -> list[Placed]:
        return await place(fleet, login, instances, records, stack)

    async def planning_gpus(self, fleet_file: FleetFile, entry: HostEntry) -> Offered | None:
        assert isinstance(fleet_file.cluster, SlurmCluster)  # the registry's: Slurm fleets only
        return Offered(*await cluster_gpus(entry, fleet_file.cluster, fleet_file.engine.tp))


PLACEMENT = SlurmPlacement()
