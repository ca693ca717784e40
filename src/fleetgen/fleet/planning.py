"""The I/O side of `fleetgen plan`: gather the model shape, GPU/RAM facts and engine version, run the
pure plan, then (unless offline) run each host's OWN engine argument parser on the exact argv and fold its
verdict in.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from fleetgen.atomic import write_atomic
from fleetgen.chattemplate import MODEL_FILES, TOKENIZER_FILE
from fleetgen.config import EngineConfig, FleetFile, HostEntry
from fleetgen.deploy.modelshape import is_path_like, model_shape
from fleetgen.deploy.placement import placement_of
from fleetgen.engines import Engine, ParserVerdict, get_engine, launcher_of, select_rule_set
from fleetgen.engines.rules import reported_releases
from fleetgen.errors import ModelCardError, RemoteError
from fleetgen.fleet.hostcheck import HostReport, check_hosts
from fleetgen.modelcard import ModelShape
from fleetgen.plan import FleetPlan, HostFacts, InstancePlan, Issue, facts_from_file, plan_fleet
from fleetgen.plan.job import JobShape
from fleetgen.plan.types import GIB
from fleetgen.remote import open_host

PARSER_TIMEOUT_S = 180.0  # importing SGLang's server_args pulls in triton: tens of seconds on a cold host


@dataclass(frozen=True)
class PlanInputs:
    """Everything the pure plan needs, and where it came from."""

    shape: ModelShape
    facts: dict[str, HostFacts]
    version: str | None
    notes: tuple[Issue, ...] = ()


def facts_from_report(host: HostEntry, report: HostReport) -> HostFacts:
    """Measured facts (nvidia-smi, /proc/meminfo, engine version); the file's values where none was read
    (all of them for an unreachable host)."""
    mem = report.mem_available_gib
    gpus = tuple(g.facts() for g in report.gpus)
    return facts_from_file(host, gpus, int(mem * GIB) if mem is not None else None, report.engine_version)


async def load_shape(fleet_file: FleetFile, fleet_path: Path, *, offline: bool) -> ModelShape:
    """The model shape as `up` reads it (`modelshape.model_shape`), on the first host where it is one."""
    cfg = fleet_file.engine
    if cfg.model_config_dir or not is_path_like(cfg.model):
        return await model_shape(cfg, fleet_path, None)
    if offline:
        raise ModelCardError(
            "--offline needs the model's config.json locally, and engine.model_config is not set",
            fix="set engine.model_config to a local folder holding config.json and "
            "model.safetensors.index.json, or plan without --offline",
        )
    async with open_host(fleet_file.hosts[0]) as conn:
        return await model_shape(cfg, fleet_path, conn)


async def tokenizer_dir_for(fleet_file: FleetFile, fleet_path: Path, *, offline: bool) -> Path | None:
    """Where the model's tokenizer files are read here: `engine.model_config` (relative to the fleet file),
    else the model folder on the first host, its `tokenizer.json` (with its chat template files, where it
    has them) read as its config.json is and kept beside the fleet's state (`_kept`). The job's prompts are
    counted with it; a run records its chat template. None offline, for a hub id, or where the host has no
    tokenizer.json: the prompts are then estimated, and the job's shape says so."""
    cfg = fleet_file.engine
    if cfg.model_config_dir is not None:
        return _local_folder(cfg.model_config_dir, fleet_path)
    if offline or not is_path_like(cfg.model):
        return None
    files: dict[str, str] = {}
    try:
        async with open_host(fleet_file.hosts[0]) as conn:
            for name in MODEL_FILES:
                try:
                    files[name] = (await conn.read(posixpath.join(cfg.model, name))).decode("utf-8")
                except RemoteError:
                    if name == TOKENIZER_FILE:
                        raise
    except (RemoteError, UnicodeDecodeError):
        return None
    return _kept(fleet_path, files)


def _local_folder(folder: str, fleet_path: Path) -> Path:
    return (fleet_path.parent / Path(folder).expanduser()).resolve()


def _kept(fleet_path: Path, files: dict[str, str]) -> Path:
    """Tokenizer files read on a host, in `.fleetgen/tokenizers/<digest>/` beside the fleet file: named by
    their content, so a changed tokenizer or template is a new folder and a kept one is never stale."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    folder = fleet_path.resolve().parent / ".fleetgen" / "tokenizers" / digest
    for name, text in files.items():
        if not (folder / name).is_file():
            write_atomic(folder / name, text)
    return folder


async def gather_inputs(fleet_file: FleetFile, fleet_path: Path, *, offline: bool) -> PlanInputs:
    """Model shape, host facts and engine version: from the file only when `offline`, else probed."""
    shape = await load_shape(fleet_file, fleet_path, offline=offline)
    if offline:
        return PlanInputs(
            shape, {h.name: facts_from_file(h) for h in fleet_file.hosts}, fleet_file.engine.version
        )
    reports = await check_hosts(fleet_file)
    facts = {h.name: facts_from_report(h, r) for h, r in zip(fleet_file.hosts, reports, strict=True)}
    notes: list[Issue] = []
    found = [r.engine_version for r in reports]
    placement = placement_of(fleet_file)
    for k, entry in enumerate(fleet_file.hosts):  # a cluster's submit host has no GPU of the fleet's
        offered = await placement.planning_gpus(fleet_file, entry)
        if offered is not None:
            facts[entry.name] = replace(facts[entry.name], gpus=offered.gpus)
            notes += offered.notes
            if offered.engine_versions is not None:  # its servers' nodes run the engine, not this host
                found[k] = None
                found += offered.engine_versions
    notes += [
        Issue("host-unreachable", f"{r.host}: {r.error}; planning it from the fleet file", r.fix or "")
        for r in reports
        if not r.reachable
    ]
    version, version_notes = version_of_hosts(fleet_file.engine, found)
    return PlanInputs(shape, facts, version, (*notes, *version_notes))


def version_of_hosts(cfg: EngineConfig, found: Iterable[str | None]) -> tuple[str | None, list[Issue]]:
    """The engine version `plan` plans with: the newest release the hosts report (as releases order, not
    text: 0.5.10 after 0.5.9), else `engine.version`; notes where the hosts differ, or differ from it."""
    versions = reported_releases(found)
    listed, wanted, notes = ", ".join(versions), cfg.version, []
    if len(versions) > 1:
        text = f"hosts run different {cfg.kind} versions: {listed}; planning with {versions[-1]}"
        notes.append(Issue("engine-version", text, "install one version everywhere"))
    if versions and wanted and wanted not in versions:
        text = f"engine.version = {wanted} but the hosts run {listed}; planning with what runs"
        notes.append(Issue("engine-version", text, "update engine.version"))
    return (versions[-1] if versions else wanted), notes


async def check_with_host_parser(fleet_file: FleetFile, plan: FleetPlan) -> FleetPlan:
    """Run the engine's own parser on each host (first instance's exact argv; others differ only in port)."""
    firsts: dict[str, InstancePlan] = {}
    for inst in plan.instances:
        firsts.setdefault(inst.host, inst)
    verdicts = await asyncio.gather(
        *(_parse_on(fleet_file, fleet_file.host(h), p) for h, p in firsts.items())
    )
    by_host = dict(zip(firsts, verdicts, strict=True))
    instances = []
    for inst in plan.instances:
        errors, warnings = by_host.get(inst.host, ((), ()))
        instances.append(replace(inst, errors=inst.errors + errors, warnings=inst.warnings + warnings))
    return replace(plan, instances=tuple(instances))


async def _parse_on(
    fleet_file: FleetFile, host: HostEntry, inst: InstancePlan
) -> tuple[tuple[Issue, ...], ...]:
    engine = get_engine(fleet_file.engine.kind)
    args = list(inst.argv[1 + len(launcher_of(fleet_file.engine)) :])
    try:
        async with open_host(host) as conn:
            result = await conn.run(
                [fleet_file.engine.python, "-c", engine.parser_check_script()],
                check=False,
                stdin=json.dumps(args).encode(),
                timeout=PARSER_TIMEOUT_S,
            )
    except RemoteError as exc:
        text = f"{host.name}: could not run {engine.name}'s parser: {exc.message}"
        return (), (Issue("engine-parser", text, exc.fix),)
    verdict = engine.parse_verdict(result.stdout)
    if verdict.is_ok:
        return (), ()
    if verdict.error.startswith(("ModuleNotFoundError", "ImportError")):
        text = f"{host.name}: {engine.name}'s parser did not import: {verdict.error}"
        return (), (Issue("engine-parser", text, "`fleetgen hosts check` shows what is missing"),)
    return (parser_refusal(engine, host.name, verdict, inst),), ()


def parser_refusal(engine: Engine, host: str, verdict: ParserVerdict, inst: InstancePlan) -> Issue:
    """The host's own parser refused the argv. Its words are a rejection rule's: the fix `plan` gives for
    that rule on this instance, else the engine's own for the release the host reports (a rule plan did
    not predict); else an argument the parser names."""
    text = f"{host}: {engine.name} {verdict.version} refuses this argv: {verdict.error}"
    predicted = next((e.fix for e in inst.errors if e.fix and e.message in verdict.error), None)
    if predicted is not None:
        return Issue("engine-parser", text, predicted)
    rules = next((r for r in engine.rule_sets if r.name == inst.rules), None)
    if verdict.version or rules is None:
        rules, _ = select_rule_set(engine.rule_sets, verdict.version or None)
    known = next((s for s in engine.rejection_signatures_for(rules) if s.search(verdict.error)), None)
    fix = known.fix if known else "change the flag it names (see the plan's renamed-flag warnings)"
    return Issue("engine-parser", text, fix)


async def plan_from_file(
    fleet_file: FleetFile, fleet_path: Path, *, offline: bool, target: int | None, job: JobShape | None = None
) -> FleetPlan:
    """The whole `fleetgen plan`: inputs, pure plan, and (online) the hosts' own parser verdicts."""
    inputs = await gather_inputs(fleet_file, fleet_path, offline=offline)
    detected = {n: [g.index for g in f.gpus] for n, f in inputs.facts.items() if f.gpus is not None}
    fleet_file.instances(detected, source=fleet_path)  # detected GPUs tp does not divide: refused, file:line
    plan = plan_fleet(fleet_file, inputs.shape, inputs.facts, inputs.version, target=target, job=job)
    plan = replace(plan, warnings=plan.warnings + inputs.notes)
    return plan if offline else await check_with_host_parser(fleet_file, plan)
