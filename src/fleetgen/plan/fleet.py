"""The plan of a whole fleet: every instance sized and checked, plus the rules that span instances (pure).

Fleet-wide rules: two instances on one GPU, one port used twice on a machine, the host RAM the engine's
instances pin (SGLang's hierarchical cache) summed per machine against what it has minus the engine's reserve.

`facts_from_file` gives a host's facts, what `plan` or `up` measured over the fleet file's values (one
function for both); each instance is sized on its binding GPU. The cross-instance rules (plus one machine
per ssh address:port) run in `plan` and in `up` before it starts anything. `engine_rejections`: each
instance's flags the engine itself refuses (`Planner.rejections`, its rules for `decide_launch`'s rule set;
never a memory estimate), on which `up` refuses too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from fleetgen.config import EngineConfig, FleetFile, HostEntry, Instance
from fleetgen.engines import Engine, RuleSet
from fleetgen.modelcard import ModelShape
from fleetgen.plan.fixes import ranked_fixes, solve_target
from fleetgen.plan.instance import Launch, decide_launch, size
from fleetgen.plan.job import JobShape
from fleetgen.plan.planners import planner_of
from fleetgen.plan.throughput import max_length_issue, plan_job
from fleetgen.plan.types import (
    GIB,
    JOB_UNPLANNED,
    Ask,
    FleetPlan,
    GpuFacts,
    HostFacts,
    InstancePlan,
    Issue,
    Memory,
    Planner,
)


def facts_from_file(
    host: HostEntry,
    gpus: tuple[GpuFacts, ...] = (),
    mem_available_bytes: int | None = None,
    engine_version: str | None = None,
) -> HostFacts:
    """What planning knows of a host: what was measured on it (GPUs, available RAM, engine version; `plan`
    and `up` alike), else the fleet file's values (`gpu_memory_gib`, `gpu_free_gib`, `host_memory_gib`)."""
    if not gpus and host.gpu_memory_gib is not None and host.gpus != "all":
        total = int(host.gpu_memory_gib * GIB)
        free = int((host.gpu_free_gib or host.gpu_memory_gib) * GIB)
        gpus = tuple(GpuFacts(i, total, min(free, total)) for i in host.gpus)
    if not mem_available_bytes and host.host_memory_gib is not None:
        mem_available_bytes = int(host.host_memory_gib * GIB)
    return HostFacts(host.name, gpus or None, mem_available_bytes, engine_version)


def plan_instance(
    planner: Planner,
    fleet_file: FleetFile,
    inst: Instance,
    shape: ModelShape,
    facts: HostFacts,
    launch: Launch,
    target: int | None,
    job: JobShape | None = None,
) -> InstancePlan:
    """Size and check one instance that runs `launch` (`decide_launch`'s) with its engine's `planner`; fixes
    when it does not fit; flags for `target`; for a `job`, its running requests and throughput settings."""
    cfg = fleet_file.engine_for(inst.host)
    rules = launch.rules
    base = InstancePlan(
        inst.name,
        inst.host,
        inst.gpus,
        inst.port,
        planner.engine.name,
        rules.name,
        Memory(),
        launch.argv,
        launch.env,
    )
    gpu = _binding_gpu(inst, facts)
    if isinstance(gpu, Issue):
        return replace(base, errors=(gpu,))
    ask = _ask(cfg, gpu, rules, shape)
    sized = size(planner, ask)
    warnings = [*sized.warnings, *(Issue("model", note) for note in shape.notes)]
    if not gpu.measured:
        text = f"GPU memory of {inst.host} is from the fleet file, not measured"
        warnings.append(Issue("gpu-facts", text, "run `fleetgen plan` without --offline to read nvidia-smi"))
    fixes = ranked_fixes(planner, ask, sized) if not sized.fits else ()
    errors = list(sized.errors)
    if target is not None:
        fix, why = solve_target(planner, ask, sized, target)
        fixes = ((fix,) if fix else ()) + fixes
        if fix is None:
            errors.append(Issue("target-concurrency", why, "add GPUs (more instances) or lower the target"))
    planned = plan_job(planner, ask, sized, job) if job is not None and sized.fits else None
    if job is not None:  # planned for the job: its own warning says what the engine's sizing costs it
        warnings = [w for w in warnings if w.rule != JOB_UNPLANNED]
    if planned is not None and planned.warning is not None:
        warnings.append(planned.warning)
    return replace(
        base,
        job=planned,
        memory=sized.memory,
        errors=tuple(errors),
        warnings=tuple(warnings),
        fixes=fixes,
        resolved=dict(sized.resolved),
    )


def instance_ask(
    fleet_file: FleetFile, inst: Instance, shape: ModelShape, facts: HostFacts, launch: Launch
) -> Ask | Issue:
    """What one instance asks of its engine's arithmetic: its host's flags on its binding GPU under the rule
    set `launch` was decided with (or why its GPU is not known)."""
    gpu = _binding_gpu(inst, facts)
    if isinstance(gpu, Issue):
        return gpu
    return _ask(fleet_file.engine_for(inst.host), gpu, launch.rules, shape)


def _ask(cfg: EngineConfig, gpu: GpuFacts, rules: RuleSet, shape: ModelShape) -> Ask:
    return Ask(dict(cfg.args), dict(cfg.env), cfg.tp, gpu.free_bytes, gpu.total_bytes, rules, shape)


def _binding_gpu(inst: Instance, facts: HostFacts) -> GpuFacts | Issue:
    """The GPU that binds an instance (least free memory over its TP group), or why none is known."""
    if facts.gpus is None:
        fix = "set gpu_memory_gib (and gpu_free_gib) in its [[hosts]] entry, or plan without --offline"
        return Issue("gpu-unknown", f"no GPU memory known for host {inst.host}", fix)
    gpus = {g.index: g for g in facts.gpus}
    if missing := [g for g in inst.gpus if g not in gpus]:
        have = ", ".join(str(i) for i in sorted(gpus)) or "none"
        return Issue(
            "gpu-absent",
            f"{inst.name}: GPU {', '.join(map(str, missing))} is not on host {inst.host} (it has: {have})",
            "list only GPUs the host has in hosts[].gpus",
        )
    return min((gpus[g] for g in inst.gpus), key=lambda g: g.free_bytes)


def _facts_of(facts: Mapping[str, HostFacts], host: str) -> HostFacts:
    return facts.get(host) or HostFacts(host)


def plan_fleet(
    fleet_file: FleetFile,
    shape: ModelShape,
    facts: Mapping[str, HostFacts],
    version: str | None = None,
    *,
    target: int | None = None,
    job: JobShape | None = None,
) -> FleetPlan:
    """Plan every instance of `fleet_file`; `facts` maps host name → what is known of it (file or measured,
    with the engine version it runs); `version` stands in where a host's is unknown (default
    engine.version)."""
    planner = planner_of(fleet_file.engine.kind)
    detected: dict[str, Sequence[int]] = {n: [g.index for g in f.gpus] for n, f in facts.items() if f.gpus}
    instances = fleet_file.instances(detected)
    launches = [
        decide_launch(fleet_file.engine_for(i.host), i, _facts_of(facts, i.host), version) for i in instances
    ]
    plans = [
        plan_instance(planner, fleet_file, i, shape, _facts_of(facts, i.host), launch, target, job)
        for i, launch in zip(instances, launches, strict=True)
    ]
    notes = {x.rule_warning for x in launches if x.rule_warning}
    key_errors, key_warnings = api_key_way(fleet_file, planner.engine)
    warnings = [Issue("rule-set", note) for note in sorted(notes)] + key_warnings
    if job is not None and (too_long := max_length_issue(job)) is not None:
        warnings.append(too_long)
    errors = key_errors + _cross_instance(planner, fleet_file, instances, plans, facts)
    return FleetPlan(
        tuple(plans), tuple(errors), tuple(warnings), {"target_concurrency": target} if target else {}
    )


def api_key_way(fleet_file: FleetFile, engine: Engine) -> tuple[list[Issue], list[Issue]]:
    """(errors, warnings) about how a public bind's key reaches the engine: never on its argv, which `ps`
    shows every user of the host. An env var (vLLM), else a 0600 config file (SGLang's `--config`, which
    then cannot also be the user's); an engine with neither is warned about."""
    cfg = fleet_file.engine
    if not cfg.is_public or engine.api_key_env_var:
        return [], []
    flag = engine.api_key_config_flag
    if flag is None:
        why = f"{engine.name} reads its API key from no environment variable or config file"
        why += ": it would be on its argv, readable by every user via `ps`"
        return [], [Issue("api-key", why, "bind 127.0.0.1 (reached through SSH tunnels) on shared hosts")]
    if flag.removeprefix("--") in cfg.args:
        why = (
            f"engine.args sets {flag}, which a public bind needs for the API key "
            f"({engine.name} reads its key from no environment variable, and argv is public to `ps`)"
        )
        fix = f"move the options of that file into [engine.args] and remove {flag.removeprefix('--')}"
        return [Issue("api-key", why, fix)], []
    return [], []


def cross_instance_errors(
    fleet_file: FleetFile,
    instances: Sequence[Instance],
    plans: Sequence[InstancePlan],
    facts: Mapping[str, HostFacts],
) -> list[Issue]:
    """The rules that span instances, run by `plan` AND by `up` before it launches anything: two instances
    on one GPU or one port of a machine, pinned host RAM summed per machine."""
    return _cross_instance(planner_of(fleet_file.engine.kind), fleet_file, instances, plans, facts)


def _cross_instance(
    planner: Planner,
    fleet_file: FleetFile,
    instances: Sequence[Instance],
    plans: Sequence[InstancePlan],
    facts: Mapping[str, HostFacts],
) -> list[Issue]:
    one_gpu = "give each [[hosts]] entry of one machine its own gpus list"
    one_port = "give the [[hosts]] entries of one machine distinct base_port"
    return (
        _clashes(fleet_file, instances, "gpu-shared", lambda i: i.gpus, "use GPU {}", one_gpu)
        + _clashes(fleet_file, instances, "port-clash", lambda i: (i.port,), "listen on port {}", one_port)
        + _host_memory(planner, fleet_file, plans, facts)
    )


def engine_rejections(
    fleet_file: FleetFile, instances: Sequence[Instance], shape: ModelShape, facts: Mapping[str, HostFacts]
) -> list[Issue]:
    """The engine's own refusals of each instance's flags (its rules for the rule set `decide_launch` picks,
    in its words, each named by instance), run by `up` before it launches anything: certain, unlike the
    memory arithmetic's estimates, and known without GPU figures."""
    planner = planner_of(fleet_file.engine.kind)
    refused: list[Issue] = []
    for inst in instances:
        cfg = fleet_file.engine_for(inst.host)
        rules = decide_launch(cfg, inst, _facts_of(facts, inst.host)).rules
        ask = Ask(dict(cfg.args), dict(cfg.env), cfg.tp, 0, 0, rules, shape)
        found = planner.rejections(ask)
        refused += [replace(e, message=f"{inst.name}: {e.message}") for e in found]
    return refused


def _machines(fleet_file: FleetFile) -> dict[str, str]:
    """Host name → machine: one per SSH address and port (a gateway forwarding its ports to several machines,
    as GPU rentals do, is several machines; two [[hosts]] entries with one `ssh` share GPUs and ports)."""
    return {h.name: "local" if h.is_local else f"{h.address}:{h.port}" for h in fleet_file.hosts}


def _clashes(
    fleet_file: FleetFile,
    instances: Sequence[Instance],
    rule: str,
    claims: Callable[[Instance], Iterable[int]],
    what: str,
    fix: str,
) -> list[Issue]:
    """Two instances claiming one thing (`what`, formatted with it) of one machine: a GPU, a port."""
    owner: dict[tuple[str, int], str] = {}
    errors = []
    machines = _machines(fleet_file)
    for inst in instances:
        for claim in claims(inst):
            key = (machines[inst.host], claim)
            if key in owner:
                errors.append(
                    Issue(rule, f"{inst.name} and {owner[key]} both {what.format(claim)} of {key[0]}", fix)
                )
            owner.setdefault(key, inst.name)
    return errors


def _host_memory(
    planner: Planner, fleet_file: FleetFile, plans: Sequence[InstancePlan], facts: Mapping[str, HostFacts]
) -> list[Issue]:
    """Host RAM the engine's instances pin (its `Planner.host_ram`), per machine, against its available RAM
    minus the engine's reserve."""
    ram = planner.host_ram
    if ram is None:
        return []
    machines = _machines(fleet_file)
    pinned: dict[str, int] = defaultdict(int)
    available: dict[str, int | None] = {}
    for plan in plans:
        machine = machines[plan.host]
        pinned[machine] += ram.pinned(plan.memory)
        available.setdefault(machine, _facts_of(facts, plan.host).mem_available_bytes)
    errors = []
    for machine, want in pinned.items():
        have = available[machine]
        if want and have is not None and want > have - ram.reserve_bytes:
            text = ram.refusal.message.format(req=want / 1e9, avail=(have - ram.reserve_bytes) / 1e9)
            errors.append(replace(ram.refusal, message=f"{machine}: {text}"))
    return errors
