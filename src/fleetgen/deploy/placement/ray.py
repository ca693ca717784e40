"""Servers placed by a Ray cluster (`[cluster] kind = "ray"`): one placement group per server, held by a
detached actor.

Why a placement group per server and not one for the fleet: each server then has its own `tp` GPUs on one
node (STRICT_PACK), its own end (a node lost or an actor killed ends one server, not the fleet) and its own
re-placement (`--restart-dead`, `up`) while the others keep serving; why an actor: it holds the group's GPUs
for as long as the server runs and dies with it (`remote.raynode`). The actor runs the job script (`JOB_SH`):
it creates the launch's new log (0600), writes the pidfile and `exec`s the SAME rendered `launch.sh` SSH hosts
run, so its child *is* the engine. The node is reached as a `RayHost` (Ray tasks pinned to it), so the chain
of SSH hosts runs unchanged there (`deploy.instance.follow_launch` / `keep_running`: argv and env from /proc,
readiness from the log, planned vs actual). No secret is in the runtime env, the actor's arguments or an
argv: the key travels in 0600 files, as for SSH hosts and Slurm.

`down` kills the actors and removes their groups, waits until Ray lists neither, then sweeps what the engine
left on its node (every process carrying the actor's mark, `raynode.MARK`). `place` says where each server
runs, and a server gone in Ray's words (the node's death reason, the group's state), for `status` and `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import aiohttp

from fleetgen.config import FleetFile, HostEntry, Instance, RayCluster
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey, launch_problems
from fleetgen.deploy.instance import (
    find_running,
    follow_launch,
    keep_running,
    push_launch,
    remove_secret_files,
    running_process,
)
from fleetgen.deploy.placement import raynodes
from fleetgen.deploy.placement.base import Offered, Placed
from fleetgen.deploy.placement.launched import engine_pid, job_script, placement_name
from fleetgen.deploy.script import Command
from fleetgen.deploy.session import HostSession, open_session
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.types import Action, InstanceCommand, Outcome, Rollout, Say, WantedInstance, settle
from fleetgen.deploy.verify import process_drift
from fleetgen.errors import DeployError, FleetgenError, LaunchFailed
from fleetgen.plan import Issue, facts_from_file
from fleetgen.remote import ray
from fleetgen.remote.raynode import MARK

JOB_SH = job_script("Ray actor ${FLEETGEN_RAY_SERVER:-?}")


def actor_name(fleet_path: Path, instance: str) -> str:
    """The actor (and placement group) name of an instance: unique per fleet file in its namespace."""
    return placement_name("fleetgen", fleet_path, instance)


def _cluster(fleet_file: FleetFile) -> RayCluster:
    assert isinstance(fleet_file.cluster, RayCluster)  # the registry: Ray fleets only
    return fleet_file.cluster


def _spec(fleet: Fleet, instance: Instance) -> ray.ServerSpec:
    c = _cluster(fleet.file)
    name = actor_name(fleet.path, instance.name)
    return ray.ServerSpec(name, c.namespace, len(instance.gpus), c.resources, c.labels, c.runtime_env)


@contextlib.asynccontextmanager
async def node_session(
    fleet_file: FleetFile, name: str, http: aiohttp.ClientSession, node: ray.RayNode
) -> AsyncIterator[HostSession]:
    """A node as a host (`name`: the cluster's, as the fleet file names it): Ray tasks pinned to it; its
    address is where a public bind is reached."""
    values = {"name": name, "workdir": _cluster(fleet_file).workdir, "ssh": node.address}
    host = ray.RayHost(name, node, is_here=node.address == ray.driver_address())
    entry = HostEntry.model_validate(values)
    async with open_session(entry, fleet_file.engine, http, check_launch=False, host=host) as hs:
        yield hs


class NodeSessions:
    """Each node's session (so its survey, one Ray task) opened once, on first use, for one command and
    closed with `stack`: a server's stop and the sweep after it, and the servers sharing a node, share it."""

    def __init__(self, fleet: Fleet, login: HostSession, stack: contextlib.AsyncExitStack) -> None:
        self.fleet, self.login, self._stack = fleet, login, stack
        self._opened: dict[str, HostSession] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    async def of(self, node: ray.RayNode) -> HostSession:
        async with self._opening.setdefault(node.node_id, asyncio.Lock()):
            if node.node_id not in self._opened:
                session = node_session(self.fleet.file, self.login.entry.name, self.login.http, node)
                self._opened[node.node_id] = await self._stack.enter_async_context(session)
        return self._opened[node.node_id]


async def _ensure(
    fleet: Fleet, login: HostSession, run: Rollout, wanted: WantedInstance, out: Outcome
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await _replace_or_keep(NodeSessions(fleet, login, stack), run, wanted, out)


async def _replace_or_keep(nodes: NodeSessions, run: Rollout, wanted: WantedInstance, out: Outcome) -> None:
    """`up` of one server: kept where it runs as wanted; else its old actor removed, what it left swept, and
    a new one placed and launched (`_launch`)."""
    spec = _spec(nodes.fleet, wanted.inst)
    record = run.records.get(wanted.inst.name)
    state = await ray.server_state(spec.name, spec.namespace, record.node if record else "")
    if record is not None and state.is_alive and state.node is not None:
        node = await nodes.of(state.node)
        running = await find_running(node, wanted, record)
        if running and not run.force and not process_drift(wanted.command, running, wanted.secret_value):
            await keep_running(node, wanted, run, out, running)
            return
        if running:  # as SSH hosts stop a server (TERM, then KILL): its actor's end would KILL it
            await node.host.stop(running.pid, start_time=running.start_time)
    if await ray.remove_server(spec.name, spec.namespace):
        why = "restart" if run.force else "flags or env changed, or its process is gone"
        run.progress(wanted.inst.name, f"removed Ray actor {spec.name} and its placement group ({why})")
    out.swept = await _sweep(nodes, record, state.node, wanted.command)
    out.action = Action.REPLACED if state.is_alive else Action.STARTED
    await _launch(nodes.fleet, nodes.login, run, wanted, out)


async def _launch(
    fleet: Fleet, login: HostSession, run: Rollout, wanted: WantedInstance, out: Outcome
) -> None:
    """A new actor and group for the server, its launch started on the node Ray picked and followed until
    ready and verified; undone (actor and group removed) where it fails."""
    spec = _spec(fleet, wanted.inst)
    placed = await ray.place_server(spec, _cluster(fleet.file).pending_timeout_s)
    run.progress(wanted.inst.name, f"Ray placed actor {spec.name} on {placed.describe()}")

    async def undo() -> None:
        await ray.remove_server(spec.name, spec.namespace)

    try:
        async with node_session(fleet.file, login.entry.name, login.http, placed) as node:
            # a node that joined after `launch_survey` read the others: its release checked as theirs were
            # (against the release it took from them: `login` stands with its survey)
            found, took = node.survey.engine_version, login.survey.engine_version
            if refused := raynodes.version_refusal(fleet.file.engine, placed, found, took):
                raise refused
            log = await push_launch(node.host, wanted)
            paths = wanted.command.paths
            await node.host.run(["rm", "-f", "--", paths.pidfile])  # the actor's job writes its own
            await ray.launch(spec, JOB_SH, paths.script, log, paths.pidfile, paths.root)
            pid, start_time = await _engine_pid(node, wanted, spec.name)
            rec = wanted.record(login.entry.name, log, pid, start_time, placement_id=spec.name)
            await follow_launch(node, wanted, replace(rec, node=placed.node_id), run, out, undo=undo)
    except DeployError:  # LaunchFailed and VerifyError were undone by follow_launch; the rest here
        await undo()
        raise


async def _engine_pid(node: HostSession, wanted: WantedInstance, name: str) -> tuple[int, int]:
    """The engine's PID and start time on the node: the process carries the actor's mark."""
    fix = f"read the launch's log in {wanted.command.paths.logs} on the node"
    return await engine_pid(node, wanted, (MARK, name), f"Ray actor {name} started its launch", fix)


async def _sweep(
    nodes: NodeSessions, rec: InstanceRecord | None, node: ray.RayNode | None, command: Command
) -> list[int]:
    """What the recorded launch left alive on its node once its actor is gone, stopped as SSH hosts stop a
    server: every process carrying the actor's mark (the engine's children outlive it: only the launch
    itself dies with the actor), and its key files. Nothing to sweep where the node is gone."""
    if rec is None or not rec.placement_id or node is None or not node.is_alive:
        return []
    hs = await nodes.of(node)
    await remove_secret_files(hs.host, command)
    left = await hs.host.marked_processes(MARK, rec.placement_id)
    stopped = await asyncio.gather(
        *(hs.host.stop(p.pid, start_time=p.start_time, timeout=10.0) for p in left)
    )
    return sorted({pid for group in stopped for pid in group})


async def down_servers(
    fleet: Fleet, login: HostSession, targets: Sequence[InstanceCommand], records: dict[str, InstanceRecord]
) -> list[Outcome]:
    """`down`: each server stopped as SSH hosts stop one (TERM, then KILL), its actor killed and group
    removed (by name, whatever the state file says), Ray checked to list neither, then what the engine left
    on its node swept (`_sweep`). Each node is surveyed once (`NodeSessions`), however many servers it has."""

    async def stop(nodes: NodeSessions, target: InstanceCommand, out: Outcome) -> None:
        spec, record = _spec(fleet, target.inst), records.get(target.inst.name)
        state = await ray.server_state(spec.name, spec.namespace, record.node if record else "")
        if state.is_alive and state.node is not None:
            node = await nodes.of(state.node)
            running = await running_process(node, target.command, record)
            if running is not None:
                await node.host.stop(running.pid, start_time=running.start_time)
                out.pid = running.pid
        was_placed = await ray.remove_server(spec.name, spec.namespace)
        out.swept = await _sweep(nodes, record, state.node, target.command)
        out.action = Action.STOPPED if was_placed or out.swept else Action.ABSENT

    async with contextlib.AsyncExitStack() as stack:
        return await settle(login.entry.name, targets, partial(stop, NodeSessions(fleet, login, stack)))


async def place(
    fleet: Fleet,
    login: HostSession,
    instances: Sequence[Instance],
    records: dict[str, InstanceRecord],
    stack: contextlib.AsyncExitStack,
) -> list[Placed]:
    """Each instance's actor as Ray reports it now; live ones get their node opened (on `stack`), one
    session per node."""
    nodes, placed = NodeSessions(fleet, login, stack), []
    for inst in instances:
        rec = records.get(inst.name)
        if rec is None or not rec.placement_id:
            placed.append(Placed(inst, None, "no Ray actor: `fleetgen up` places one", has_ended=True))
            continue
        state = await ray.server_state(rec.placement_id, _cluster(fleet.file).namespace, rec.node)
        if not state.is_alive or state.node is None:
            placed.append(Placed(inst, None, state.why, has_ended=True))
            continue
        where = f"Ray actor {rec.placement_id} on {state.node.describe()}"
        placed.append(Placed(inst, await nodes.of(state.node), where, placement_id=rec.placement_id))
    return placed


async def launch_survey(fleet: Fleet, login: HostSession, say: Say) -> HostSurvey:
    """What every server is launched by (`raynodes.launch_survey`), read on the nodes a server may be placed
    on, one Ray task each, before anything is placed: the cluster reached, GPUs enough on its live nodes (all
    of them, and a node with `tp` of them: a server's group is STRICT_PACK), the engine's python and model
    folder on each node (`node_problems`), and one engine release and workdir on all of them."""
    cluster, tp = _cluster(fleet.file), fleet.file.engine.tp
    await ray.connect(cluster.address, cluster.namespace, say)
    listed = await ray.nodes()
    problems = gpu_problems(cluster, tp, listed)
    if problems:
        raise DeployError(
            "; ".join(p.message for p in problems) + " (checked before anything was placed)",
            fix="; ".join(p.fix for p in problems),
        )
    nodes = _server_nodes(cluster, tp, listed)
    read = await asyncio.gather(*(_survey(fleet.file, login.entry.name, login.http, n) for n in nodes))
    surveyed = list(zip(nodes, read, strict=True))
    found = node_problems(fleet, login.entry, surveyed)
    if found:
        raise raynodes.before_placing(found)
    return raynodes.launch_survey(fleet.file.engine, login.survey, surveyed)


async def _survey(
    fleet_file: FleetFile, name: str, http: aiohttp.ClientSession, node: ray.RayNode
) -> HostSurvey:
    async with node_session(fleet_file, name, http, node) as hs:
        return hs.survey


def node_problems(
    fleet: Fleet, entry: HostEntry, surveyed: Sequence[tuple[ray.RayNode, HostSurvey]]
) -> list[LaunchFailed]:
    """What stops the engine from starting on each node (`hostsurvey.launch_problems`: its python, its
    launcher module, the model folder), as the node's survey read it; the first problem of each node that
    has one, naming the node."""
    found = []
    for node, survey in surveyed:
        if problems := launch_problems(survey, entry, fleet.file.engine):
            there = problems[0].message.removeprefix(f"{entry.name}: ").replace("on the host", "there")
            found.append(
                LaunchFailed(f"Ray {node.label}: {there}", context={"node": node.label}, fix=problems[0].fix)
            )
    return found


def gpu_problems(cluster: RayCluster, tp: int, nodes: Sequence[ray.RayNode]) -> list[Issue]:
    """`cluster.gpus` over the GPUs of the cluster's live nodes, and no node with `tp` of them."""
    alive = _placeable(cluster, nodes)
    total, widest = sum(int(n.gpus) for n in alive), max((int(n.gpus) for n in alive), default=0)
    seen = ", ".join(f"{n.node_id[:8]} {n.address}: {n.gpus:g}" for n in alive) or "no live node"
    found = []
    if cluster.gpus > total:
        text = f"cluster.gpus = {cluster.gpus}, but the Ray cluster's live nodes have {total} GPU(s) ({seen})"
        found.append(Issue("cluster-gpus", text, f"set cluster.gpus to at most {total}, or add GPU nodes"))
    if tp > widest:
        text = f"engine.tp = {tp}, but no live node of the Ray cluster has over {widest} GPU(s) ({seen})"
        found.append(Issue("cluster-gpus", text, "lower engine.tp, or add nodes with more GPUs"))
    return found


def _placeable(cluster: RayCluster, nodes: Sequence[ray.RayNode]) -> list[ray.RayNode]:
    """The live nodes a server of the cluster may be placed on: those with every label it asks for."""
    return [n for n in nodes if n.is_alive and all(n.labels.get(k) == v for k, v in cluster.labels.items())]


def _server_nodes(cluster: RayCluster, tp: int, nodes: Sequence[ray.RayNode]) -> list[ray.RayNode]:
    """The nodes a server may be placed on (its group is STRICT_PACK): placeable, with `tp` GPUs or more."""
    return [n for n in _placeable(cluster, nodes) if n.gpus >= tp]


class RayPlacement:
    """`[cluster] kind = "ray"`: a placement group and a detached actor per server (this module)."""

    kind = "ray"
    label = "a Ray cluster"
    can_tune = False
    is_per_instance = True
    launches_on_login = False  # the driver is no node: `launch_survey` reads the nodes

    async def launch_survey(self, fleet: Fleet, login: HostSession, say: Say) -> HostSurvey:
        return await launch_survey(fleet, login, say)

    async def preflight(self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance]) -> None:
        """Nothing beyond `launch_survey` (it read every node a server may be placed on)."""

    async def up(
        self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance], run: Rollout
    ) -> list[Outcome]:
        return await settle(login.entry.name, wanted, partial(_ensure, fleet, login, run))

    async def down(
        self,
        fleet: Fleet,
        login: HostSession,
        targets: Sequence[InstanceCommand],
        records: dict[str, InstanceRecord],
    ) -> list[Outcome]:
        await ray.connect(_cluster(fleet.file).address, _cluster(fleet.file).namespace)
        return await down_servers(fleet, login, targets, records)

    async def place(
        self,
        fleet: Fleet,
        login: HostSession,
        instances: Sequence[Instance],
        records: dict[str, InstanceRecord],
        stack: contextlib.AsyncExitStack,
    ) -> list[Placed]:
        await ray.connect(_cluster(fleet.file).address, _cluster(fleet.file).namespace)
        return await place(fleet, login, instances, records, stack)

    async def planning_gpus(self, fleet_file: FleetFile, entry: HostEntry) -> Offered | None:
        """The cluster's GPU nodes, asked online: their count checked against `cluster.gpus`; each slot
        planned as the fleet file's `gpu_memory_gib` (Ray reports GPUs by count, not memory); the engine
        release of each node a server may be placed on (a Ray task each, as `up`'s `launch_survey`), never
        the driver's. A connection tried again, and a node that could not be surveyed, are notes."""
        cluster, tp, said = _cluster(fleet_file), fleet_file.engine.tp, list[str]()
        await ray.connect(cluster.address, cluster.namespace, said.append)
        listed = await ray.nodes()
        notes = [Issue("ray-connect", line, ray.LOADED_HEAD_FIX) for line in said]
        notes += gpu_problems(cluster, tp, listed)
        nodes = _server_nodes(cluster, tp, listed)
        async with aiohttp.ClientSession() as http:
            read = await asyncio.gather(
                *(_survey(fleet_file, entry.name, http, n) for n in nodes), return_exceptions=True
            )
        versions = []
        for node, survey in zip(nodes, read, strict=True):
            if isinstance(survey, FleetgenError):
                text = f"Ray {node.label}: its engine release not read: {survey.message}"
                notes.append(Issue("engine-version", text, survey.fix))
            elif isinstance(survey, BaseException):
                raise survey
            else:
                versions.append(survey.engine_version)
        return Offered(facts_from_file(entry).gpus or (), notes, tuple(versions))


PLACEMENT = RayPlacement()
