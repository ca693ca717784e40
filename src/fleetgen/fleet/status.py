"""The live truth of a fleet, re-read from the hosts: process, drift, health, load, through fresh tunnels.

The state file only says which PID (and start time) to look at; everything reported is read now: /proc for
the process and its argv/environ (drift), the health endpoint, /metrics and SGLang's /server_info.
`FleetView` keeps the SSH connections (and so the tunnels) open for as long as it lives: `status --watch`
and `fleetgen run` use one (re-reading one instance: `FleetView.read`); `fleet_status` opens one for a single
read. The engine's own numbers are read by `fleet.enginestate`, as for a bare URL.

This module observes; whether an instance is ready is `deploy.readiness.decide`'s to say, from what it saw
(`Seen`), the why beside it as the problem text. The command is compared with /proc, never a rendered script.

`status` (a view opened with `probe`) also sends each healthy instance one tiny chat request
(`EngineClient.probe`), because /health answers 200 on a server that fails every request (or generates
nothing): an error reply or a dropped connection is a problem (DOWN, the reply quoted), and so is no answer
within `PROBE_TIMEOUT_S` where its engine queues nothing (idle, yet not answering: stalled); a busy server's
slow answer is not held against it. Why a probe request and not what a running job recorded: `status` does
not know which job (if any) runs on the fleet, nor where its store is, and a probe sees a server no job uses
yet; it costs one token per instance. `run`, `bench` and the dashboard, which re-read the fleet often, do not
probe: a job judges its servers by its own requests (`generate/health.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fleetgen.config import LOOPBACK, Instance
from fleetgen.deploy.death import Death, death_of, signatures_of
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import open_hosts
from fleetgen.deploy.instance import running_process
from fleetgen.deploy.listener import port_owners, stranger_problem
from fleetgen.deploy.placement import placement_of
from fleetgen.deploy.readiness import NOT_RUNNING, Readiness, Seen, decide
from fleetgen.deploy.script import Command
from fleetgen.deploy.session import HostSession
from fleetgen.deploy.state import InstanceRecord, load_state
from fleetgen.deploy.verify import process_drift
from fleetgen.deploy.wanted import api_key, wanted_command
from fleetgen.errors import EndpointError, FleetgenError
from fleetgen.fleet.enginestate import read_engine
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import Scrape
from fleetgen.remote.base import Host

PROBE_TIMEOUT_S = 10.0  # `status`'s probe request: one token, sent to an engine that says it queues nothing
# The log lines read for a dead engine's last words: SGLang's out-of-memory traceback runs to 120.
DEATH_LINES = 400


@dataclass
class InstanceStatus:
    """One instance as its host and engine report it now. `to_json` gives the `status --json` keys."""

    instance: str
    host: str
    gpus: tuple[int, ...]
    port: int
    pid: int | None = None
    url: str = ""
    readiness: Readiness = Readiness.WAITING
    drift: list[str] = field(default_factory=list)
    uptime_s: float | None = None
    running: int | None = None
    queued: int | None = None
    gen_tokens_per_s: float | None = None
    spec_accept_length: float | None = None
    kv_usage: float | None = None
    max_running_requests: int | None = None
    running_is_floor: bool = False  # max_running_requests is a floor its engine runs past (vLLM's)
    log_path: str = ""
    problem: str = ""
    placement: str = ""  # a cluster's: its job or actor and node ("Slurm job 12 on node1")

    def to_json(self) -> dict[str, Any]:
        """`ready` (true only when READY) where `readiness` stands; every other field as it is."""
        fields = {"ready" if k == "readiness" else k: v for k, v in asdict(self).items()}
        uptime_s = None if self.uptime_s is None else round(self.uptime_s, 1)
        return {**fields, "ready": self.readiness is Readiness.READY, "uptime_s": uptime_s}


@dataclass
class _Tracked:
    hs: HostSession
    inst: Instance
    command: Command  # what it runs as the fleet file wants it (compared with /proc: drift)
    before: Scrape | None = None
    placement: str = ""
    placement_id: str = ""  # a cluster's: the job or actor its session reaches the node of
    # the death found in a gone launch's log, by launch (pid, start time, log): read once, not each refresh
    death: tuple[tuple[int, int, str], Death] | None = None


class FleetView:
    """Open hosts and tunnels for one fleet; `refresh()` re-reads every instance. Use `open_view`."""

    def __init__(self, fleet: Fleet, secret: str | None, *, probe: bool = False) -> None:
        self.fleet = fleet
        self.secret = secret
        self.probe = probe  # send each healthy instance a probe request (`status`)
        self.tracked: list[_Tracked] = []
        self.failed: list[InstanceStatus] = []
        # Where `plan` and `up` read the model's shape (`modelshape.model_shape`): the first host reached.
        self.model_host: Host | None = None

    def track(self, hs: HostSession, inst: Instance, *, placement: str = "", placement_id: str = "") -> None:
        """Track `inst` (read it at each refresh) through `hs` (its host, or its job's or actor's node)."""
        command = wanted_command(self.fleet.file, self.fleet.engine, inst, hs.survey)
        self.tracked.append(_Tracked(hs, inst, command, placement=placement, placement_id=placement_id))

    @property
    def names(self) -> list[str]:
        """The instances this view reads on their hosts (not those it could not reach)."""
        return [w.inst.name for w in self.tracked]

    async def read(self, name: str, rate_window_s: float = 0.0) -> InstanceStatus:
        """One instance's status, read now (a job re-reading the instance it waits for)."""
        return await self._one(self._tracked(name), rate_window_s)

    async def url_of(self, name: str) -> str:
        """The URL of an instance, running or not: opening the forward connects nothing (each connection
        through it does), so it opens before anything listens on the port; "" while its host is unreachable
        (the status read beside it says why)."""
        w = self._tracked(name)
        try:
            return await w.hs.url_for(w.inst.port)
        except FleetgenError:
            return ""

    async def death(self, name: str) -> Death | None:
        """Why the instance's engine died, in its own words (`deploy.death`, over its log's tail on its
        host); None where its log shows no error (or cannot be read: its host says why elsewhere)."""
        return await self._death(self._tracked(name), load_state(self.fleet.path).get(name))

    async def _death(self, w: _Tracked, rec: InstanceRecord | None) -> Death | None:
        path = rec.log_path if rec is not None and rec.log_path else w.command.paths.current_log
        try:
            text = await w.hs.host.tail(path, DEATH_LINES)
        except FleetgenError:  # no log yet, or the host went away: nothing in the engine's words
            return None
        return death_of(text.splitlines(), signatures_of(self.fleet.engine, rec.rule_set if rec else ""))

    async def _launch_death(self, w: _Tracked, rec: InstanceRecord) -> Death | None:
        """`_death` of the recorded launch, read once it is found (a dashboard refreshes every second); a
        log that shows none yet is read again (its last lines may still be on their way through the log's
        redactor)."""
        launch = (rec.pid, rec.start_time, rec.log_path)
        if w.death is not None and w.death[0] == launch:
            return w.death[1]
        died = await self._death(w, rec)
        if died is not None:
            w.death = (launch, died)
        return died

    def _tracked(self, name: str) -> _Tracked:
        return next(w for w in self.tracked if w.inst.name == name)

    def is_replaced(self, name: str) -> bool:
        """A cluster's instance whose job or actor was replaced since this view placed it (by `up` or
        `--restart-dead`, perhaps on another node): this view's session may reach the wrong node."""
        placed = next((w.placement_id for w in self.tracked if w.inst.name == name), "")
        record = load_state(self.fleet.path).get(name)
        return bool(placed) and (record is None or record.placement_id != placed)

    async def refresh(self, rate_window_s: float = 1.0) -> list[InstanceStatus]:
        """Every instance's status, read now; throughput needs two scrapes (the previous refresh, or a
        second one `rate_window_s` later the first time) for engines that only export counters."""
        got = await asyncio.gather(*(self._one(w, rate_window_s) for w in self.tracked))
        return sorted([*got, *self.failed], key=lambda s: s.instance)

    async def _one(self, w: _Tracked, rate_window_s: float) -> InstanceStatus:
        inst = w.inst
        st = InstanceStatus(inst.name, inst.host, inst.gpus, inst.port, placement=w.placement)
        try:
            seen = await self._read(w, st, rate_window_s)
        except FleetgenError as exc:  # its host went away mid-read
            seen = Seen(unseen=exc.message)
        st.readiness, st.problem = decide(seen)
        st.log_path = st.log_path or w.command.paths.current_log
        return st

    async def _read(self, w: _Tracked, st: InstanceStatus, rate_window_s: float) -> Seen:
        """Look at the instance, filling `st` with what it shows; stop once what is seen settles it."""
        rec = load_state(self.fleet.path).get(st.instance)
        running = await running_process(w.hs, w.command, rec)
        if running is None:  # launched (recorded) and gone: its log says why; stopped by `down`: no record
            died = await self._launch_death(w, rec) if rec is not None else None
            return Seen(is_alive=False, gone=f"{NOT_RUNNING}: it died: {died.text()}" if died else "")
        st.pid, st.uptime_s = running.pid, w.hs.survey.uptime_of(running.start_time)
        st.log_path = rec.log_path if rec and rec.pid == running.pid else ""
        st.drift = process_drift(w.command, running, self.secret)
        st.url = await w.hs.url_for(st.port)
        client = EngineClient(st.url, session=w.hs.http, api_key=self.secret, timeout_s=10.0)
        engine = self.fleet.engine
        if not await client.is_healthy(engine.health_path):
            return Seen(is_alive=True, is_healthy=False)
        owners = await port_owners(w.hs.host, st.port)
        # the health check was answered, but maybe not by this instance's process
        stranger = stranger_problem(owners, running.pid, w.hs.public_bind or LOOPBACK)
        seen = Seen(is_alive=True, is_healthy=True, stranger=stranger, drift=tuple(st.drift))
        if stranger:
            return seen
        try:
            state = await read_engine(
                client, engine, w.before, args=w.command.args, rate_window_s=rate_window_s
            )
        except EndpointError as exc:
            return replace(seen, engine_problem=exc.message)
        w.before, load = state.scrape, state.load
        st.running, st.queued, st.kv_usage = load.running, load.queued, load.kv_usage
        st.gen_tokens_per_s, st.spec_accept_length = load.gen_tokens_per_s, load.spec_accept_length
        st.max_running_requests, st.running_is_floor = state.max_running_requests, state.running_is_floor
        failing = await probe_failure(client, idle=not load.queued) if self.probe else ""
        return replace(seen, engine_problem=state.problem, failing=failing)


async def probe_failure(client: EngineClient, *, idle: bool, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Why one probe request shows the instance does not take work: an error reply, a dropped connection,
    or (`idle`: its engine queues nothing) no answer within `timeout_s`; "" when it answered, or was merely
    slow while its engine queues requests."""
    try:
        failure = await client.probe(await client.served_model(), timeout_s)
    except EndpointError as exc:  # /v1/models failed: the same server, the same trouble
        return exc.message
    if failure is None or not (failure.status is not None or failure.is_connection or idle):
        return ""
    return failure.message


@contextlib.asynccontextmanager
async def open_view(
    fleet: Fleet, *, only: Sequence[str] | None = None, probe: bool = False
) -> AsyncIterator[FleetView]:
    """A FleetView with every wanted host connected; hosts that fail show up as not-ready statuses; `probe`:
    each healthy instance is sent a probe request too (`status`)."""
    view = FleetView(fleet, api_key(fleet.file), probe=probe)
    async with (
        open_hosts(fleet, only, check_launch=False) as opened,
        contextlib.AsyncExitStack() as nodes,
    ):
        view.model_host = next((hs.host for hs, _ in opened.sessions.values()), None)
        for hs, instances in opened.sessions.values():
            try:
                picked = opened.selection.pick(hs.entry.name, instances)
                await _place(view, hs, picked, nodes)
            except FleetgenError as exc:
                opened.fail(hs.entry, exc, instances)
        static = {i.name: i for h in fleet.file.hosts for i in fleet.file.instances_on(h)}
        for name, entry, error in opened.failed:
            gpus, port = (static[name].gpus, static[name].port) if name in static else ((), 0)
            readiness, why = decide(Seen(unseen=error.message))
            view.failed.append(InstanceStatus(name, entry.name, gpus, port, readiness=readiness, problem=why))
        yield view


async def engine_deaths(fleet: Fleet, names: Sequence[str]) -> dict[str, Death]:
    """Why each named instance's engine died, in its own words (`FleetView.death`), for those whose log shows
    it: what `bench` says where requests failed, instead of the failures' transport errors."""
    async with open_view(fleet, only=names) as view:
        found = {name: await view.death(name) for name in view.names if name in names}
    return {name: died for name, died in found.items() if died is not None}


async def _place(
    view: FleetView, login: HostSession, instances: list[Instance], stack: contextlib.AsyncExitStack
) -> None:
    """Each instance where its placement says it runs now (`Placement.place`): tracked through its node's
    session (its host's, on SSH hosts); the others say where their job or actor is (pending and why, or
    ended in the cluster's words: down, `fleetgen up` places it again)."""
    fleet = view.fleet
    placed = await placement_of(fleet.file).place(fleet, login, instances, load_state(fleet.path), stack)
    for p in placed:
        if p.node is not None:
            view.track(p.node, p.inst, placement=p.where, placement_id=p.placement_id)
            continue
        seen = Seen(is_alive=False, gone=p.where) if p.has_ended else Seen(unseen=p.where)
        readiness, why = decide(seen)
        status = InstanceStatus(p.inst.name, login.entry.name, p.inst.gpus, p.inst.port, readiness=readiness)
        status.problem, status.placement = why, p.where
        view.failed.append(status)


async def fleet_status(
    fleet: Fleet, *, only: Sequence[str] | None = None, rate_window_s: float = 1.0, probe: bool = False
) -> list[InstanceStatus]:
    """One read of every (selected) instance (`probe`: with a probe request each); tunnels are closed again
    afterwards."""
    async with open_view(fleet, only=only, probe=probe) as view:
        return await view.refresh(rate_window_s)
