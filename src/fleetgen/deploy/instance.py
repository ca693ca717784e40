"""The life of one instance on its host: leave it, replace it, or start it; then wait ready and verify.

`ensure_up` is idempotent: a process whose /proc argv and environ equal the rendered ones is left running
(and re-verified). Anything else is stopped (TERM → wait → KILL), its port (and, where nvidia-smi exists,
its GPUs) waited free, and a new process spawned from a freshly pushed, verified `launch.sh`, with a new log.

`open_session` gives a surveyed host (a fleet host or a Slurm node); `push_launch` pushes the folder, key
files and script wherever the instance is placed; `follow_launch` is everything after a launch (wait ready,
prove it holds its port, verify), wherever it was placed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar

import aiohttp

from fleetgen.config import LOOPBACK, EngineConfig, HostEntry, Instance
from fleetgen.deploy.hostsurvey import HostSurvey, prepare_host
from fleetgen.deploy.listener import port_owners, stranger_problem
from fleetgen.deploy.probes import probe_instance, wait_gpus_released, wait_port_free
from fleetgen.deploy.readywait import StartedProcess, wait_ready
from fleetgen.deploy.script import Command
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.verify import Verified, process_drift, verify_engine
from fleetgen.engines.base import Engine
from fleetgen.errors import ConfigError, FleetgenError, LaunchFailed, VerifyError
from fleetgen.http.client import EngineClient
from fleetgen.plan import Launch
from fleetgen.remote import open_host
from fleetgen.remote.base import Host, ProcInfo

Narrate = Callable[[str, str], None]  # (instance, message)

# The instance's folder: its owner's only (key files, script, logs live there).
PRIVATE_DIR_SH = 'mkdir -p -- "$1" && chmod 700 -- "$1"'


class Action(enum.StrEnum):
    UNCHANGED = "unchanged"  # the running process already matched: left alone
    STARTED = "started"  # nothing ran: a new process
    REPLACED = "replaced"  # a different (or forced) process was stopped and a new one started
    STOPPED = "stopped"
    ABSENT = "absent"  # down: nothing was running


@dataclass(frozen=True)
class InstanceCommand:
    """An instance and the command it runs, no script rendered: all `down` needs to find its process (pidfile,
    argv[0]), remove its key files and wait its port free (`wanted.wanted_command` builds the command)."""

    inst: Instance
    command: Command


class _OfInstance(Protocol):
    @property
    def inst(self) -> Instance: ...


_Item = TypeVar("_Item", bound=_OfInstance)


@dataclass(frozen=True)
class WantedInstance:
    """One instance as the fleet file wants it."""

    inst: Instance
    launch: Launch  # what decided argv + env: the engine version and rule set (recorded in the state)
    command: Command
    script: str
    sha256: str
    secret_value: str | None
    planned: Mapping[str, float]
    timeout_s: float

    def record(
        self, host: str, log_path: str, pid: int = 0, start_time: int = 0, slurm_job: str = ""
    ) -> InstanceRecord:
        """The state file's record of launching this instance on `host` (a Slurm job: pid 0 until it runs)."""
        return InstanceRecord(
            instance=self.inst.name,
            host=host,
            gpus=self.inst.gpus,
            port=self.inst.port,
            pid=pid,
            start_time=start_time,
            log_path=log_path,
            script_path=self.command.paths.script,
            script_sha256=self.sha256,
            launched_at=datetime.now(UTC).isoformat(),
            argv=self.command.argv,
            env_names=tuple(sorted(self.command.environ)),
            engine_version=self.launch.version,
            rule_set=self.launch.rules.name,
            slurm_job=slurm_job,
        )


@dataclass
class HostSession:
    """An open host with what fleetgen learned about it during this command."""

    entry: HostEntry
    host: Host
    survey: HostSurvey
    http: aiohttp.ClientSession
    public_bind: str | None = None

    async def url_for(self, port: int) -> str:
        """Where fleetgen reaches a port: a local SSH forward, or directly on a public bind: its address, or,
        bound to every interface, the host's SSH address (a `local` host, whose address is the word "local",
        at its own loopback)."""
        bind, wildcard = self.public_bind, {"0.0.0.0": "127.0.0.1", "::": "[::1]"}
        if not bind:
            return f"http://127.0.0.1:{await self.host.forward(port)}"
        if bind in wildcard:
            address = wildcard[bind] if self.entry.is_local else self.entry.address
        else:
            address = f"[{bind}]" if ":" in bind else bind
        return f"http://{address}:{port}"

    async def client_for(self, wanted: WantedInstance) -> EngineClient:
        """The engine client of an instance on this host, with its key."""
        url = await self.url_for(wanted.inst.port)
        return EngineClient(url, session=self.http, api_key=wanted.secret_value)


@contextlib.asynccontextmanager
async def open_session(
    entry: HostEntry,
    cfg: EngineConfig,
    http: aiohttp.ClientSession,
    *,
    check_launch: bool = True,
    host: Host | None = None,
) -> AsyncIterator[HostSession]:
    """`entry` connected (`host`, else `open_host(entry)`) and surveyed (`prepare_host`); closes the
    connection (and its tunnels) on exit. A loopback bind other than 127.0.0.1 on an SSH host is the HOST's
    loopback, reached neither directly nor through tunnels (they go to 127.0.0.1): refused first."""
    if not entry.is_local and cfg.bind != LOOPBACK and is_loopback(cfg.bind):
        raise ConfigError(
            f"engine.bind = {cfg.bind!r} is {entry.name}'s own loopback: fleetgen cannot reach a server "
            "there",
            fix="keep engine.bind = '127.0.0.1' (reached through SSH tunnels), or bind '0.0.0.0' or an "
            "address of the host with engine.api_key_env set",
            context={"host": entry.name},
        )
    async with host or open_host(entry) as host:
        survey = await prepare_host(host, entry, cfg, check_launch=check_launch)
        yield HostSession(entry, host, survey, http, public_bind=cfg.bind if cfg.is_public else None)


def is_loopback(address: str) -> bool:
    """`localhost` or a loopback IP (127.0.0.0/8, ::1)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@dataclass
class Outcome:
    """What `up`/`down` did to one instance, and what it established."""

    instance: str
    host: str
    action: Action | None = None
    pid: int | None = None
    url: str = ""
    log_path: str = ""
    error: FleetgenError | None = None
    verified: Verified | None = None
    elapsed_s: float = 0.0
    record: InstanceRecord | None = field(default=None, repr=False)
    swept: list[int] = field(default_factory=list)  # a Slurm job's leftovers on its node, stopped


async def find_running(
    hs: HostSession, wanted: WantedInstance, record: InstanceRecord | None
) -> ProcInfo | None:
    """The live process of this instance: the recorded PID + start time, else the host's pidfile's."""
    return await running_process(hs, wanted.command, record)


async def running_process(
    hs: HostSession, command: Command, record: InstanceRecord | None
) -> ProcInfo | None:
    """The live process running `command`: the recorded PID + start time, else the host's pidfile's (`status`
    needs the command alone, never a rendered script)."""
    recorded = (record.pid, record.start_time) if record and record.host == hs.entry.name else None
    at_record, named = await probe_instance(hs.host, command.paths.pidfile, recorded)
    if at_record is not None and at_record.is_alive:
        return at_record
    # Only a process running our launch script's command counts (the PID may have been reused).
    if named is not None and named.is_alive and named.argv[:1] == (command.python,):
        return named
    return None


@dataclass(frozen=True)
class Rollout:
    """What one `up` brings to each instance: the engine, the earlier launches' records, whether to restart
    what already runs as wanted, and where progress lines and new launch records go."""

    engine: Engine
    records: Mapping[str, InstanceRecord]
    progress: Narrate
    on_record: Callable[[InstanceRecord], None]
    force: bool = False


async def settle(
    host: str, wanted: Sequence[_Item], work: Callable[[_Item, Outcome], Awaitable[None]]
) -> list[Outcome]:
    """`work` on each instance in parallel (a `WantedInstance` for `up`, an `InstanceCommand` for `down`),
    each on a new Outcome, timed: done when it returns, its error kept when it raises one of ours."""

    async def one(w: _Item) -> Outcome:
        out = Outcome(instance=w.inst.name, host=host)
        started = time.monotonic()
        try:
            await work(w, out)
        except FleetgenError as exc:
            out.error = exc
        out.elapsed_s = time.monotonic() - started
        return out

    return list(await asyncio.gather(*(one(w) for w in wanted)))


async def ensure_up(hs: HostSession, run: Rollout, wanted: WantedInstance, out: Outcome) -> None:
    """Bring one instance to the wanted state and verify it (through `settle`: errors go in the Outcome)."""
    record = run.records.get(wanted.inst.name)
    running = await find_running(hs, wanted, record)
    if running and not run.force and not process_drift(wanted.command, running, wanted.secret_value):
        await keep_running(hs, wanted, run, out, running)
        return
    await _clear_way(hs, wanted, running, run)
    out.action = Action.REPLACED if running else Action.STARTED
    paths = wanted.command.paths
    log_path = await push_launch(hs.host, wanted)
    spawned = await hs.host.spawn(paths.script, log_path, paths.pidfile, cwd=paths.root)
    run.progress(wanted.inst.name, f"spawned pid {spawned.pid}, log {log_path}")
    rec = wanted.record(hs.entry.name, spawned.log_path, spawned.pid, spawned.start_time)
    await follow_launch(hs, wanted, rec, run, out)


async def push_launch(host: Host, wanted: WantedInstance) -> str:
    """The instance's 0700 folder, its key files (created 0600, then filled) and launch.sh, verified; the
    new launch's log path."""
    paths = wanted.command.paths
    await host.run(["sh", "-c", PRIVATE_DIR_SH, "fleetgen", paths.root])
    for path, data in wanted.command.secret_files(wanted.secret_value or "").items():
        await host.put(path, data, mode=0o600)
    await host.put(paths.script, wanted.script.encode(), mode=0o700)
    return paths.new_log()


async def follow_launch(
    hs: HostSession,
    wanted: WantedInstance,
    rec: InstanceRecord,
    run: Rollout,
    out: Outcome,
    *,
    undo: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """After a launch, wherever it was placed: record it, wait ready (reading its log), prove it alone holds
    its port, verify the process and the engine's own view. A launch that fails here is undone (default: its
    process stopped; a Slurm placement cancels its job) so the next `up` starts clean."""
    run.on_record(rec)
    out.record, out.pid, out.log_path = rec, rec.pid, rec.log_path
    client = await hs.client_for(wanted)
    out.url, name = client.base_url, wanted.inst.name
    try:
        try:
            launch_log = await wait_ready(
                StartedProcess(name, hs.host, rec.pid, rec.start_time, rec.log_path),
                run.engine,
                client,
                rules=wanted.launch.rules,
                timeout_s=wanted.timeout_s,
                progress=lambda m: run.progress(name, m),
            )
        finally:
            await remove_secret_files(hs.host, wanted.command)  # read at start: a healthy engine is past that
        await prove_listener(hs, wanted, rec.pid)
    except (LaunchFailed, VerifyError) as exc:
        # A half-dead engine can keep its port and GPU memory; one that cannot serve on its port is of no use.
        await (undo() if undo else hs.host.stop(rec.pid, start_time=rec.start_time, timeout=10.0))
        exc.context["stopped"] = f"pid {rec.pid} (its log stays at {rec.log_path})"
        raise
    run.progress(name, "healthy; verifying the process and the engine's own view")
    out.verified = await _verify(hs, wanted, run.engine, client, rec.pid, rec.start_time, launch_log.lines)


async def keep_running(
    hs: HostSession, wanted: WantedInstance, run: Rollout, out: Outcome, running: ProcInfo
) -> None:
    """The process already runs as wanted: leave it, and verify it like a new one."""
    record = run.records.get(wanted.inst.name)
    out.action, out.pid = Action.UNCHANGED, running.pid
    out.record = record if record is not None and record.pid == running.pid else None
    out.log_path = out.record.log_path if out.record else wanted.command.paths.current_log
    run.progress(wanted.inst.name, f"already running as wanted (pid {running.pid}); verifying")
    await prove_listener(hs, wanted, running.pid)
    client = await hs.client_for(wanted)
    out.url = client.base_url
    log_lines = (await hs.host.tail(out.log_path, 400)).splitlines()
    out.verified = await _verify(hs, wanted, run.engine, client, running.pid, running.start_time, log_lines)


async def _clear_way(hs: HostSession, wanted: WantedInstance, running: ProcInfo | None, run: Rollout) -> None:
    """Stop the old process (then wait for its port and GPUs), or refuse a port someone else holds."""
    port = wanted.inst.port
    if running:
        why = "restart" if run.force else "flags or env changed"
        run.progress(wanted.inst.name, f"stopping pid {running.pid} ({why})")
        await hs.host.stop(running.pid, start_time=running.start_time)
        await wait_port_free(hs.host, port)
        if hs.survey.has_nvidia_smi:
            await wait_gpus_released(hs.host, wanted.inst.gpus)
    elif (owners := await port_owners(hs.host, port)).listeners:
        raise LaunchFailed(
            f"{wanted.inst.name}: port {port} on {hs.entry.name} is already in use by "
            + owners.describe(owners.listeners, set()),
            context={"host": hs.entry.name, "port": port},
            fix=f"stop what listens there (`ss -ltnp | grep :{port}` on the host) or set "
            "hosts.base_port / engine.base_port to free ports",
        )


async def _verify(
    hs: HostSession,
    wanted: WantedInstance,
    engine: Engine,
    client: EngineClient,
    pid: int,
    start_time: int,
    log_lines: list[str],
) -> Verified:
    info = await hs.host.inspect(pid, start_time)
    if not info.is_alive:
        raise LaunchFailed(
            f"{wanted.inst.name}: the process (pid {pid}) is gone after becoming healthy",
            fix=f"read its log: `fleetgen logs {wanted.inst.name}`",
            context={"host": hs.entry.name},
        )
    drift = process_drift(wanted.command, info, wanted.secret_value)
    if drift:
        raise VerifyError(
            f"{wanted.inst.name}: the running process differs from the launch script (drift)",
            fix=f"run `fleetgen restart --only {wanted.inst.name}`; if it persists, something on "
            "the host rewrites the command (a wrapper, a profile script)",
            context={"host": hs.entry.name, "pid": pid, "drift": "\n".join(drift)},
        )
    return await verify_engine(wanted.command, engine, client, log_lines=log_lines, planned=wanted.planned)


async def remove_secret_files(host: Host, command: Command) -> None:
    """Remove the key files a launch read (whether or not this run pushed them: `down` cleans up too)."""
    if command.secret is not None:
        await host.run(["rm", "-f", "--", *command.secret_files("")])


async def prove_listener(hs: HostSession, wanted: WantedInstance, pid: int) -> None:
    """Raise VerifyError unless the process fleetgen started (or its child) alone holds the sockets that
    answer on the instance's port: a health check answered by another process proves nothing."""
    port = wanted.inst.port
    why = stranger_problem(await port_owners(hs.host, port), pid, hs.public_bind or LOOPBACK)
    if why:
        raise VerifyError(
            f"{wanted.inst.name}: on {hs.entry.name}, {why}",
            fix="stop that process, or give this instance a free port (hosts.base_port / engine.base_port "
            "in the fleet file), then `fleetgen up` again (`fleetgen plan` shows clashes between instances)",
            context={"host": hs.entry.name, "port": port, "pid": pid},
        )


async def stop_instance(
    hs: HostSession, records: Mapping[str, InstanceRecord], target: InstanceCommand, out: Outcome
) -> None:
    """Stop one instance (TERM → wait → KILL of its process group) and wait until its port is free (through
    `settle`)."""
    await remove_secret_files(hs.host, target.command)
    running = await running_process(hs, target.command, records.get(target.inst.name))
    if running is None:
        out.action = Action.ABSENT
        return
    await hs.host.stop(running.pid, start_time=running.start_time)
    await wait_port_free(hs.host, target.inst.port)
    out.action, out.pid = Action.STOPPED, running.pid
