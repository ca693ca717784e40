"""`fleetgen tune`, the whole of it: plan the job's candidates per GPU class, measure them in rounds under
the budget (one per instance at once, narrowing in on the best), write the winners as a new fleet file,
price the whole job at the measured rates, and stop every server it started (or bring the tuned fleet up,
`--keep chosen`).

Refusals come before anything starts: a Slurm fleet (not yet), a fleet whose own instances run (tune needs
their GPUs), a fleet file that already forces an acceptance length, `--keep chosen` with a forced one, dummy
weights without output lengths to draw from, `--out` over the user's own file.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from fleetgen.config import Instance
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import up
from fleetgen.deploy.placement import placement_of
from fleetgen.deploy.state import load_state
from fleetgen.deploy.wanted import refuse_simulated_acceptance
from fleetgen.errors import ConfigError
from fleetgen.fleet.planning import PlanInputs, gather_inputs, tokenizer_dir_for
from fleetgen.generate.forced import Filler
from fleetgen.generate.jobshape import filler_of, read_job_shape
from fleetgen.generate.source import count_records
from fleetgen.plan import InstancePlan, Issue, decide_launch, plan_fleet
from fleetgen.plan.fleet import instance_ask
from fleetgen.plan.job import JobShape
from fleetgen.plan.planners import planner_of
from fleetgen.plan.types import Memory, Setting, Sizing
from fleetgen.tune.classes import GpuClass, group_by_class
from fleetgen.tune.fleetfile import file_data, tuned_text
from fleetgen.tune.measure import Load, Say, Trial, measure
from fleetgen.tune.search import Budget, Family, family_key, narrow, next_round, resizer
from fleetgen.tune.verdict import BASELINE, FinishTime, Measured, baseline_of, finish_time, winner


@dataclass(frozen=True)
class TuneOptions:
    """What the command line asks: the load, the budget (s), whether options that change the numbers may be
    measured and chosen, the tuned file's path, tune's own folder, and whether the tuned fleet stays up."""

    load: Load
    budget_s: float
    out: Path
    folder: Path
    allow_numerics: bool = False
    keep_chosen: bool = False
    narrowing_rounds: int = 2  # per class, after the plan's candidates (0: none)
    # shell patterns of the candidates to measure (empty: all; the file's own always)
    only: tuple[str, ...] = ()


@dataclass
class TuneResult:
    """Everything measured, the winners, and what they mean for the job."""

    job_shape: JobShape
    classes: dict[GpuClass, list[str]]
    filler: Filler | None = None  # the steady start's (None: the batch started empty)
    measured: list[Measured] = field(default_factory=list)
    chosen: dict[GpuClass, Measured] = field(default_factory=dict)
    baselines: dict[GpuClass, Measured | None] = field(default_factory=dict)
    unmeasured: dict[GpuClass, list[str]] = field(default_factory=dict)  # left out by the budget
    rounds: int = 0
    budget: Budget = field(default_factory=lambda: Budget(0.0))
    finish: FinishTime | None = None
    finish_baseline: FinishTime | None = None
    out: Path | None = None
    kept: list[str] = field(default_factory=list)


def candidates_for(plan: InstancePlan, *, allow_numerics: bool, only: Sequence[str] = ()) -> list[Setting]:
    """The settings to measure on one instance's GPU class, the fleet file's own first: the plan's for the
    job (`plan --job`'s, ranked), without those that change the numbers unless allowed, and (`only`) without
    those whose names match none of the given shell patterns. THE seam between what the plan offers and what
    tune measures. A setting the plan runs none of (withheld: SGLang's admission runs far fewer than its pools
    hold, its bound says why) is not measured."""
    if plan.job is None:
        return []
    mine, *others = plan.job.settings
    offered = [mine, *(s for s in others if s.running > 0 and (allow_numerics or not s.numerics))]
    if only:
        offered = offered[:1] + [s for s in offered[1:] if any(fnmatch.fnmatchcase(s.name, p) for p in only)]
    # after the user's own, the plan's best with speculative decoding each way before the rest: a budget
    # that ends early has still measured what speculation costs or buys at its best batch
    head, rest = offered[:1], offered[1:]
    best = {s.is_spec: i for i, s in reversed(list(enumerate(rest)))}
    firsts = sorted(best.values())
    return head + [rest[i] for i in firsts] + [s for i, s in enumerate(rest) if i not in firsts]


def refuse(fleet: Fleet, opts: TuneOptions) -> None:
    """What tune will not do, before it starts anything (each with its fix)."""
    placement = placement_of(fleet.file)
    if not placement.can_tune:
        raise ConfigError(
            f"{fleet.path}: tune measures on [[hosts]] fleets; a fleet placed by {placement.label} is not "
            "supported yet",
            fix="tune on a [[hosts]] fleet file naming the same GPU kinds, then copy its [engine.args]",
        )
    refuse_simulated_acceptance(fleet)
    running = sorted(load_state(fleet.path))
    if running:
        raise ConfigError(
            f"{fleet.path}: its instances are deployed ({', '.join(running)}): tune needs their GPUs",
            fix=f"`fleetgen down -f {fleet.path}` first (tune brings the tuned fleet up with --keep chosen)",
        )
    if opts.keep_chosen and opts.load.simulate_accept_length is not None:
        raise ConfigError(
            "--keep chosen with --simulate-accept-length: a server that forces its acceptance writes text "
            "the model did not choose, and tune never leaves one running",
            fix="drop --keep chosen (then `fleetgen up -f` the tuned file), or measure real acceptance",
        )
    if opts.out.resolve() == fleet.path.resolve():
        raise ConfigError(
            f"--out {opts.out} is the fleet file itself: tune never writes the user's file",
            fix="give --out another path (default: <fleet>.tuned.toml beside it)",
        )
    if fleet.file.engine.args.get("load-format") == "dummy" and opts.load.lengths is None:
        raise ConfigError(
            f"{fleet.path}: load-format = dummy: its weights write no real text, so no answer ends where the "
            "job's would; tune needs the lengths each request should write",
            fix="give --output-lengths mean=1800,min=300,max=6000 (or an earlier run's folder)",
        )


async def tune(fleet: Fleet, opts: TuneOptions, say: Say) -> TuneResult:
    """The whole tune (see the module's docstring)."""
    refuse(fleet, opts)
    load = opts.load
    inputs = await gather_inputs(fleet.file, fleet.path, offline=False)
    tokenizer_dir = await tokenizer_dir_for(fleet.file, fleet.path, offline=False)
    job_shape = await asyncio.to_thread(
        read_job_shape,
        load.job_file,
        load.input_path,
        tokenizer_dir=tokenizer_dir,
        output_lengths=load.lengths,
    )
    say(f"the job's prompts: {job_shape.counted_with}; context {job_shape.context_tokens:,} tokens")
    if load.lengths is not None and load.steady_start:
        load = replace(load, filler=await asyncio.to_thread(filler_of, tokenizer_dir))
        f = load.filler
        say(f"steady start: written parts as {f.unit!r} × n, {f.unit_tokens} token(s) each, {f.counted_with}")
    plan = plan_fleet(fleet.file, inputs.shape, inputs.facts, inputs.version, job=job_shape)
    groups = group_by_class(plan.instances, inputs.facts)
    result = TuneResult(job_shape, {c: [p.instance for p in ps] for c, ps in groups.items()})
    result.filler = load.filler if load.lengths is not None and load.steady_start else None
    detected = {n: [g.index for g in f.gpus] for n, f in inputs.facts.items() if f.gpus is not None}
    instances = {i.name: i for i in fleet.file.instances(detected)}
    pending: dict[GpuClass, list[Setting]] = {}
    for cls, plans in groups.items():
        pending[cls] = candidates_for(plans[0], allow_numerics=opts.allow_numerics, only=opts.only)
        if not pending[cls]:
            why = "; ".join(e.message for e in plans[0].errors) or "no plan for the job"
            raise ConfigError(
                f"{plans[0].instance} ({cls.name}): nothing to measure: {why}",
                fix=f"`fleetgen plan -f {fleet.path}` shows why; fix the fleet file, then tune again",
            )
    _refuse_unmatched(opts, groups, pending)
    tools = {
        cls: _search_tools(fleet, plans[0], inputs, instances, job_shape) for cls, plans in groups.items()
    }
    base = file_data(fleet.file, fleet.path)
    budget, narrowed = Budget(opts.budget_s), dict.fromkeys(groups, 0)
    while any(pending.values()):
        trials = _round(groups, pending, budget, instances, opts.folder / f"round{result.rounds + 1}")
        if not trials:
            break
        result.rounds += 1
        left = f"{budget.left_s:.0f} s of budget left"
        say(f"round {result.rounds}: {len(trials)} candidate(s) at once ({left})")
        started = time.monotonic()
        found = await asyncio.gather(*(measure(base, fleet.engine, t, load, say) for t in trials))
        budget = budget.after_round(time.monotonic() - started)
        result.measured += found
        for cls in groups:
            tried = [m.setting for m in result.measured if m.gpu_class == cls]
            best = winner([m for m in result.measured if m.gpu_class == cls])
            if pending[cls] or best is None or narrowed[cls] >= opts.narrowing_rounds:
                continue
            narrowed[cls] += 1
            family, resize = tools[cls]
            pending[cls] = narrow(best.setting, tried, family, resize)
    result.budget = budget
    result.unmeasured = {c: [s.name for s in p] for c, p in pending.items() if p}
    _conclude(fleet, opts, result)
    if opts.keep_chosen and result.out is not None:
        outs = await up(Fleet.load(result.out))
        result.kept = [o.instance for o in outs if o.error is None]
        for o in outs:
            if o.error is not None:
                say(f"--keep chosen: {o.instance} did not start: {o.error.message}")
    return result


def _refuse_unmatched(
    opts: TuneOptions,
    groups: Mapping[GpuClass, list[InstancePlan]],
    pending: Mapping[GpuClass, list[Setting]],
) -> None:
    """An `--only` pattern that names no candidate of any class is a typo, not a request to measure less."""
    chosen = {s.name for settings in pending.values() for s in settings[1:]}
    unmatched = [p for p in opts.only if not any(fnmatch.fnmatchcase(n, p) for n in chosen)]
    if unmatched:
        offered = sorted(
            {
                s.name
                for ps in groups.values()
                for s in candidates_for(ps[0], allow_numerics=opts.allow_numerics)
            }
            - {BASELINE}
        )
        raise ConfigError(
            f"--only {', '.join(unmatched)}: no candidate of this job is named so "
            f"(offered: {', '.join(offered)})",
            fix="give names or shell patterns from `fleetgen plan --job` (the file's own is always measured)",
        )


def _search_tools(
    fleet: Fleet, plan: InstancePlan, inputs: PlanInputs, instances: Mapping[str, Instance], job: JobShape
) -> tuple[Family, Callable[[Setting, int], Setting | None]]:
    """A class's narrowing: its settings' families and how one is sized for n running requests, from the
    planner and the class's first instance as `plan` sized it."""
    inst = instances[plan.instance]
    facts = inputs.facts[inst.host]
    launch = decide_launch(fleet.file.engine_for(inst.host), inst, facts, inputs.version)
    ask = instance_ask(fleet.file, inst, inputs.shape, facts, launch)
    planner = planner_of(fleet.file.engine.kind)
    if isinstance(ask, Issue):  # sized by `plan` already: its GPU is known
        raise ConfigError(ask.message, fix=ask.fix)
    keys = list(planner.concurrency(ask, Sizing(Memory()), 1))  # the flags that size it for n
    return family_key(keys), resizer(planner, ask, job)


def _round(
    groups: Mapping[GpuClass, Sequence[InstancePlan]],
    pending: dict[GpuClass, list[Setting]],
    budget: Budget,
    instances: Mapping[str, Instance],
    folder: Path,
) -> list[Trial]:
    """The next round over every class at once: each class's next candidates, one per instance (taken off
    `pending`); none when the budget cannot take a round."""
    trials: list[Trial] = []
    for cls, plans in groups.items():
        picked = next_round(pending[cls], len(plans), budget)
        del pending[cls][: len(picked)]
        for setting, plan in zip(picked, plans, strict=False):
            slot = len(trials)
            trials.append(
                Trial(cls, setting, instances[plan.instance], slot, folder / f"{slot}-{setting.name}")
            )
    return trials


def _conclude(fleet: Fleet, opts: TuneOptions, result: TuneResult) -> None:
    """The winners per class, the tuned fleet file, and the job's time at the winners' and the baselines'
    rates."""
    for cls in result.classes:
        mine = [m for m in result.measured if m.gpu_class == cls]
        result.baselines[cls] = baseline_of(mine)
        best = winner(mine)
        if best is not None:
            result.chosen[cls] = best
    if not result.chosen:
        return
    host_class = {p: c for c, names in result.classes.items() for n in names for p in [_host_of(fleet, n)]}
    header = _header(fleet, opts, result)
    text = tuned_text(
        file_data(fleet.file, fleet.path), fleet.path, result.chosen, host_class, result.baselines, header
    )
    opts.out.write_text(text, encoding="utf-8")
    result.out = opts.out
    num = count_records(opts.load.input_path, None) * opts.load.job_file.samples
    counts = {c: len(n) for c, n in result.classes.items()}
    tokens = _tokens_per_completion(result)
    result.finish = finish_time(
        num, tokens, counts, {c: m.decode_tps or 0.0 for c, m in result.chosen.items()}
    )
    base_rates = {c: m.decode_tps or 0.0 for c, m in result.baselines.items() if m is not None}
    result.finish_baseline = finish_time(num, tokens, counts, base_rates)


def _host_of(fleet: Fleet, instance: str) -> str:
    return fleet.file.host_of_instance(instance).name


def _tokens_per_completion(result: TuneResult) -> float:
    """The job's expected output per completion; where that is only max_tokens (real weights, no lengths
    given), what the winners decoded per completion they finished over their windows."""
    if not result.job_shape.is_output_ceiling:
        return result.job_shape.output_tokens.mean
    pairs = [(m.decode_tps or 0.0, m.completions_per_s) for m in result.chosen.values()]
    done = sum(c for _, c in pairs)
    return sum(t for t, _ in pairs) / done if done > 0 else result.job_shape.output_tokens.mean


def _header(fleet: Fleet, opts: TuneOptions, result: TuneResult) -> list[str]:
    """The tuned file's first lines: who wrote it, when, from what, measured how."""
    load = opts.load
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Written by `fleetgen tune` on {when} from {fleet.path}: {len(result.measured)} candidate(s) "
        f"measured in {result.rounds} round(s), each over a {load.window_s:.0f} s window after its batch "
        "filled,",
        f"with the requests of {load.input_path} (output lengths: {result.job_shape.output_from}).",
    ]
    if load.simulate_accept_length is not None:
        lines.append(
            f"Speculative candidates ran with a forced accept length {load.simulate_accept_length:g} (tune's "
            "servers only): their rates assume the real model accepts as much."
        )
    for cls, m in result.chosen.items():
        base = result.baselines.get(cls)
        than = f" vs {BASELINE} {base.decode_tps_per_gpu:,.0f}" if base is not None and base is not m else ""
        lines.append(f"{cls.name}: {m.setting.name}, {m.decode_tps_per_gpu:,.0f} decode tok/s per GPU{than}")
    return lines
