"""`up` (`restart` is `up` with `force`) and `down` across a fleet: every host and instance in parallel.

Per host: open the SSH connection, check the workdir / python / launcher / model folder in one round trip,
then run each of its instances concurrently. A host that cannot be reached fails its own instances only.
The state file is updated as soon as a process is spawned, so `down` can always find what `up` started.

`open_hosts` is also how `status` connects. Before `up` starts anything it runs the fleet's
cross-instance rules over all hosts (a rule broken only among instances `--only` left out stops none it
picked) and the engine's own refusals of each picked instance's flags (`--no-plan-check` skips those; a
model shape read nowhere is a warning naming what went unchecked and the fix). Each host's
instances go through the fleet's placement (`deploy.placement`: the SSH hosts' own, Slurm's, Ray's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from fleetgen.config import HostEntry, Instance, Selection
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.modelshape import MODEL_CONFIG_FIX, model_shape
from fleetgen.deploy.placement import placement_of
from fleetgen.deploy.session import HostSession, open_session
from fleetgen.deploy.state import load_state, update_state
from fleetgen.deploy.types import InstanceCommand, Narrate, Outcome, Rollout
from fleetgen.deploy.wanted import (
    api_key,
    build_wanted,
    measured_facts,
    planned_figures,
    refuse_simulated_acceptance,
    wanted_command,
)
from fleetgen.errors import ConfigError, FleetgenError, ModelCardError, PlanError
from fleetgen.modelcard import ModelShape
from fleetgen.plan import (
    InstancePlan,
    cross_instance_errors,
    engine_rejections,
    plan_fleet,
)
from fleetgen.plan.job import JobShape


def _silent(_instance: str, _message: str) -> None:
    """No one to tell (`down`, `status`)."""


async def host_instances(fleet: Fleet, hs: HostSession) -> list[Instance]:
    """This host's instances; `gpus = "all"` is resolved with the GPUs nvidia-smi listed on the host."""
    detected: list[int] | None = None
    if hs.entry.gpus == "all":
        if not hs.survey.has_nvidia_smi:
            raise ConfigError(
                f'{hs.entry.name}: gpus = "all" but the host has no nvidia-smi to list its GPUs',
                fix=f"list the GPUs in the fleet file: gpus = [0, 1, …] for host {hs.entry.name}",
            )
        detected = [g.index for g in hs.survey.gpus]
    return fleet.file.instances_on(hs.entry, detected, source=fleet.path)


@dataclass
class Opened:
    """The wanted hosts, connected (with their instances), what `--only` picks of them, and the picked
    instances that failed (name, host, why)."""

    selection: Selection
    sessions: dict[str, tuple[HostSession, list[Instance]]] = field(default_factory=dict)
    failed: list[tuple[str, HostEntry, FleetgenError]] = field(default_factory=list)

    def fail(self, entry: HostEntry, exc: FleetgenError, instances: Sequence[Instance]) -> None:
        """`exc` fails every instance `--only` picks of `entry` (`instances`: its own, as far as known)."""
        self.failed += [(name, entry, exc) for name in self.selection.names(entry.name, instances)]

    def picked(self) -> list[Instance]:
        """The connected hosts' instances `--only` picks (a name a host lacks fails in that host's run)."""
        picks = self.selection.picks
        every = ((picks.get(hs.entry.name), i) for hs, insts in self.sessions.values() for i in insts)
        return [i for names, i in every if names is None or i.name in names]


@contextlib.asynccontextmanager
async def open_hosts(
    fleet: Fleet, only: Sequence[str] | None, *, check_launch: bool, progress: Narrate = _silent
) -> AsyncIterator[Opened]:
    """Every wanted host connected and surveyed at once (`open_session`), with its instances, or failed
    (`Opened.failed`); the connections close on exit. `check_launch` (`up`): each session's survey is the
    one its servers' launch is decided by (`Placement.launch_survey`: a Ray cluster's nodes', not the
    driver's), and a host or node that cannot launch them fails its instances; what it says while it waits
    goes to `progress` under the host's name."""
    opened, placement = Opened(fleet.file.select(only)), placement_of(fleet.file)
    on_login = check_launch and placement.launches_on_login  # else its `launch_survey` checks the nodes
    async with aiohttp.ClientSession() as http, contextlib.AsyncExitStack() as stack:

        async def connect(entry: HostEntry) -> None:
            try:
                session = open_session(entry, fleet.file.engine, http, check_launch=on_login)
                hs = await stack.enter_async_context(session)
                if check_launch:  # `up`: the launch decided by what runs where its servers will
                    say = functools.partial(progress, entry.name)
                    hs = replace(hs, survey=await placement.launch_survey(fleet, hs, say))
                opened.sessions[entry.name] = (hs, await host_instances(fleet, hs))
            except FleetgenError as exc:
                opened.fail(entry, exc, fleet.file.instances_on(entry))

        # Every connect ends before an unexpected error is raised: raised while others still connect, it
        # would close the stack under them (and the event loop with their SSH tasks pending).
        for result in await asyncio.gather(
            *(connect(h) for h in opened.selection.hosts(fleet.file)), return_exceptions=True
        ):
            if isinstance(result, BaseException):
                raise result
        yield opened


async def for_each_host(
    fleet: Fleet,
    only: Sequence[str] | None,
    per_host: Callable[[HostSession, list[Instance]], Awaitable[list[Outcome]]],
    *,
    check_launch: bool = True,
    check_fleet: Callable[[Opened], Awaitable[None]] | None = None,
    progress: Narrate = _silent,
) -> list[Outcome]:
    """`open_hosts`, then `check_fleet` (it sees every host before any instance is touched, and raises to
    refuse), then `per_host(hs, instances)` on each host at once."""
    async with open_hosts(fleet, only, check_launch=check_launch, progress=progress) as opened:
        if check_fleet is not None:
            await check_fleet(opened)

        async def run(hs: HostSession, instances: list[Instance]) -> list[Outcome]:
            try:
                return await per_host(hs, opened.selection.pick(hs.entry.name, instances))
            except FleetgenError as exc:
                opened.fail(hs.entry, exc, instances)
                return []

        results = await asyncio.gather(*(run(hs, insts) for hs, insts in opened.sessions.values()))
    failed = [Outcome(instance=name, host=entry.name, error=exc) for name, entry, exc in opened.failed]
    return [*failed, *(o for outs in results for o in outs)]


def plan_for_up(
    fleet: Fleet,
    opened: Opened,
    shape: ModelShape | None,
    *,
    plan_check: bool = True,
    job: JobShape | None = None,
) -> dict[str, InstancePlan]:
    """Run the cross-instance rules `plan` runs over the whole fleet and (`plan_check`, with a model shape)
    the engine's own refusals of each picked instance's flags; raise PlanError naming each broken one that
    concerns an instance `--only` picked, before anything starts. Return each instance's plan (for planned vs
    actual capacity; for `job`, planned for it as `plan --job` plans: a plan's job never changes a launch)."""
    # Every host's facts as `plan` would have them: measured where connected, else the fleet file's.
    measured = {name: hs.survey for name, (hs, _) in opened.sessions.items()}
    facts = {h.name: measured_facts(h, measured.get(h.name)) for h in fleet.file.hosts}
    detected = {n: [i for inst in insts for i in inst.gpus] for n, (_, insts) in opened.sessions.items()}
    everyone, picked = fleet.file.instances(detected, source=fleet.path), opened.picked()
    if shape is not None:
        plan = plan_fleet(fleet.file, shape, facts, job=job)
        errors, plans = list(plan.errors), {p.instance: p for p in plan.instances}
    else:  # no model shape: sizing and the flag rules unknown, GPUs and ports still checked
        errors, plans = cross_instance_errors(fleet.file, everyone, [], facts), {}
    refused = engine_rejections(fleet.file, picked, shape, facts) if shape is not None and plan_check else []
    # What breaks among the instances `--only` left out alone (a clash of two of them) stops none it picked.
    picked_names = {p.name for p in picked}
    others = [i for i in everyone if i.name not in picked_names]
    theirs = cross_instance_errors(
        fleet.file, others, [plans[i.name] for i in others if i.name in plans], facts
    )
    errors = [e for e in errors if e not in theirs]
    if errors or refused:
        fixes = list(dict.fromkeys(e.fix for e in [*errors, *refused] if e.fix))
        fix = "; ".join(fixes) + f" (`fleetgen plan -f {fleet.path}` shows the whole plan)"
        if refused:
            fix += (
                "; or `fleetgen up --no-plan-check` to launch it anyway, if you know this engine accepts it "
                "(its own refusal then shows in its log)"
            )
        raise PlanError(
            f"{fleet.path}: up refuses to start anything: "
            + "; ".join(f"[{e.rule}] {e.message}" for e in [*errors, *refused]),
            fix=fix,
        )
    return plans


async def up(
    fleet: Fleet,
    *,
    only: Sequence[str] | None = None,
    force: bool = False,
    plan_check: bool = True,
    progress: Narrate = _silent,
    allow_simulated_acceptance: bool = False,
    job: JobShape | None = None,
    planned: Callable[[list[InstancePlan]], None] = lambda _plans: None,
) -> list[Outcome]:
    """Bring every (selected) instance up, verified; `force` restarts even matching processes (restart);
    `plan_check` False launches even what the engine's own rules refuse (plan's flag rules).
    `allow_simulated_acceptance`: launch an engine that commits tokens the model did not choose (a forced
    speculative acceptance length); only a throughput measurement passes it (`tune`), never the CLI's `up`.
    `job`: plan each instance for this job too; `planned` gets the picked instances' plans (those it could
    make) before anything starts, and may raise to refuse."""
    if not allow_simulated_acceptance:
        refuse_simulated_acceptance(fleet)
    secret = api_key(fleet.file)
    plans: dict[str, InstancePlan] = {}

    async def check(opened: Opened) -> None:
        first = next((hs.host for hs, _ in opened.sessions.values()), None)
        try:
            shape: ModelShape | None = await model_shape(fleet.file.engine, fleet.path, first)
        except ModelCardError as exc:  # up goes on, saying what it could not check and how to have it checked
            shape = None
            unchecked = "the engine's own rules for each instance's flags (plan's) and " if plan_check else ""
            progress(
                str(fleet.path),
                f"warning: {unchecked}planned capacity not checked: the model's shape could not be read: "
                f"{exc.message}; fix: {MODEL_CONFIG_FIX.format(fleet.path)}",
            )
        plans.update(plan_for_up(fleet, opened, shape, plan_check=plan_check, job=job))
        planned([plans[i.name] for i in opened.picked() if i.name in plans])

    records, placement = load_state(fleet.path), placement_of(fleet.file)
    run = Rollout(fleet.engine, records, progress, lambda rec: update_state(fleet.path, put=[rec]), force)

    async def per_host(hs: HostSession, instances: list[Instance]) -> list[Outcome]:
        wanted = [
            build_wanted(fleet.file, fleet.engine, i, hs.survey, secret, planned_figures(plans.get(i.name)))
            for i in instances
        ]
        await placement.preflight(fleet, hs, wanted)
        return await placement.up(fleet, hs, wanted, run)

    return await for_each_host(fleet, only, per_host, check_fleet=check, progress=progress)


async def down(fleet: Fleet, *, only: Sequence[str] | None = None) -> list[Outcome]:
    """Stop every (selected) instance and forget it in the state."""
    records, placement = load_state(fleet.path), placement_of(fleet.file)

    async def per_host(hs: HostSession, instances: list[Instance]) -> list[Outcome]:
        targets = [
            InstanceCommand(i, wanted_command(fleet.file, fleet.engine, i, hs.survey)) for i in instances
        ]
        outs = await placement.down(fleet, hs, targets, records)
        update_state(fleet.path, drop=[o.instance for o in outs if o.error is None])
        return outs

    return await for_each_host(fleet, only, per_host, check_launch=False)
