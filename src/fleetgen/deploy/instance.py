"""The life of one instance on its host: leave it, replace it, or start it; then wait ready and verify.

`ensure_up` is idempotent: a process whose /proc argv and environ equal the rendered ones is left running
(and re-verified). Anything else is stopped (TERM → wait → KILL), its port (and, where nvidia-smi exists,
its GPUs) waited free, and a new process spawned from a freshly pushed, verified `launch.sh`, with a new log.

The host comes surveyed (`deploy.session`), the instance as values (`deploy.types`); `push_launch`
pushes the folder, key files and script wherever the instance is placed; `follow_launch` is everything
after a launch (wait ready, prove it holds its port, verify), wherever it was placed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fleetgen.config import LOOPBACK
from fleetgen.deploy.listener import port_owners, stranger_problem
from fleetgen.deploy.probes import probe_instance, wait_gpus_released, wait_port_free
from fleetgen.deploy.readywait import StartedProcess, wait_ready
from fleetgen.deploy.script import Command
from fleetgen.deploy.session import HostSession
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.types import Action, InstanceCommand, Outcome, Rollout, WantedInstance
from fleetgen.deploy.verify import Verified, process_drift, verify_engine
from fleetgen.engines.base import Engine
from fleetgen.errors import LaunchFailed, VerifyError
from fleetgen.http.client import EngineClient
from fleetgen.remote.base import Host, ProcInfo

# The instance's folder: its owner's only (key files, script, logs live there).
PRIVATE_DIR_SH = 'mkdir -p -- "$1" && chmod 700 -- "$1"'


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
