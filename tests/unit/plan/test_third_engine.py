"""A third engine plugs in without a field added to any shared struct (issue 21 §1).

`toyllm` is registered here alone, in this test (an `Engine` subclass with its own `RuleSet` subclass, and a
`Planner` whose `MemoryExtras` subclass holds its own figures and names its own rows). It is planned, fixed,
solved for a target, tabled, launched and checked planned-vs-actual through the code paths SGLang and vLLM
take (`plan_fleet`, `ranked_fixes`, `solve_target`, `cli.plan`'s table, `decide_launch`, `deploy.wanted`,
`Engine.capacity`), with no module of fleetgen changed for it. A toy, not a fake: no real engine is imitated.

Filed under `plan` (planned through `plan/planners.py` and `plan/types.py`); it also registers the
engine with `engines` and launches it through `deploy/wanted.py`.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from rich.console import Console

import fleetgen.config.engine
from fleetgen.cli.plan import _memory_table
from fleetgen.config import FleetFile
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.wanted import build_wanted, planned_figures
from fleetgen.engines import ENGINES, get_engine
from fleetgen.engines.base import Engine, MetricNames
from fleetgen.engines.rules import FlagRename, RuleSet
from fleetgen.modelcard import ModelShape, load_model_shape
from fleetgen.plan import InstancePlan, decide_launch, facts_from_file, plan_fleet
from fleetgen.plan.planners import PLANNERS, planner_of
from fleetgen.plan.types import GIB, Ask, Fix, Issue, Memory, MemoryExtras, Planner, Sizing

LLAMA = load_model_shape(Path(__file__).parents[2] / "data" / "models" / "llama-3.1-8b")
PAGE_TOKENS = 256
DEFAULT_SEQS = 64


@dataclass(frozen=True)
class ToyRules(RuleSet):
    reserve_fraction: float = 0.0  # of total GPU memory, kept outside its static budget


class ToyEngine(Engine):
    name = "toyllm"
    default_launcher = ("-m", "toyllm.serve")
    distributions = ("toyllm",)
    metrics = MetricNames.of(name, running="toyllm:running", queued="toyllm:queued")
    capacity_lines = (("toy_pages", r"allocated (\d+) pages"), ("kv_tokens", r"(\d+) KV tokens"))
    fatal_signatures = ()
    rule_sets = (
        ToyRules(
            "toyllm-1",
            Version("1.0"),
            Version("1.99"),
            renames=(FlagRename("ctx", ("max-context",), "renamed in 1.0"),),
            reserve_fraction=0.2,
        ),
    )
    tp_flag = "--tp"
    context_flag = "max-context"
    max_running_flags = ("max-seqs",)
    parser_body = 'out["version"] = "1.0"'


@dataclass(frozen=True)
class ToyExtras(MemoryExtras):
    reserve_fraction: float = 0.0
    pages: int = 0

    def budget_setting(self) -> str:
        return f"reserve-fraction {self.reserve_fraction:.2f}"

    def capacity_rows(self) -> tuple[tuple[str, str], ...]:
        return (("reserve-fraction", f"{self.reserve_fraction:.2f}"), ("toy pages", f"{self.pages:,}"))

    def planned(self) -> dict[str, float]:
        return {"toy_pages": float(self.pages)}

    def without_pools(self) -> ToyExtras:
        return replace(self, pages=0)


def _cell(shape: ModelShape, tp: int) -> int:
    return 2 * max(1, shape.num_kv_heads // tp) * shape.head_dim * len(shape.full_attention_layer_ids) * 2


def toy_size(ask: Ask) -> Sizing:
    """The toy's arithmetic: a budget of (1 - reserve) of the GPU, weights, then pages of 256 tokens."""
    assert isinstance(ask.rules, ToyRules)
    reserve = ask.rules.reserve_fraction
    budget = int(ask.total_bytes * (1 - reserve))
    weights = ask.shape.weight_bytes // ask.tp
    cell = _cell(ask.shape, ask.tp)
    pages = (budget - weights) // (cell * PAGE_TOKENS)  # negative when the weights fill it (as SGLang's)
    ctx = int(ask.args.get("max-context") or ask.shape.context_length)
    tokens = pages * PAGE_TOKENS
    running = min(int(ask.args.get("max-seqs") or DEFAULT_SEQS), tokens // ctx)
    memory = Memory(
        free_bytes=ask.free_bytes,
        budget_bytes=budget,
        weights_bytes=weights,
        rest_bytes=budget - weights,
        kv_bytes_per_token=cell,
        kv_pool_bytes=tokens * cell,
        kv_tokens=tokens,
        max_running_requests=running,
        headroom_bytes=ask.total_bytes - budget,
        context_length=ctx,
        extras=ToyExtras(reserve, pages),
    )
    errors = () if running >= 1 else (Issue("kv-cache", "toyllm: one request does not fit", "shorter"),)
    return Sizing(memory, errors)


TOY_PLANNER = Planner(
    ToyEngine(),
    toy_size,
    variants=lambda _ask: [Fix(1, "")],
    concurrency=lambda _ask, _sized, n: {"max-seqs": n},
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """`toyllm` in the three registries (engines, fleet-file kinds, planners), for this test only."""
    engine = TOY_PLANNER.engine
    monkeypatch.setitem(ENGINES, engine.name, engine)
    monkeypatch.setitem(PLANNERS, engine.name, TOY_PLANNER)
    kinds = [*fleetgen.config.engine.ENGINE_KINDS, engine.name]
    monkeypatch.setattr(fleetgen.config.engine, "ENGINE_KINDS", kinds)
    yield engine


def _fleet(args: dict[str, Any], gpu_gib: float = 24, version: str = "1.2") -> FleetFile:
    return FleetFile.model_validate(
        {
            "engine": {"kind": "toyllm", "model": "/m", "version": version, "args": args},
            "hosts": [{"name": "a", "gpus": [0], "gpu_memory_gib": gpu_gib}],
        }
    )


def _plan(fleet_file: FleetFile, target: int | None = None) -> InstancePlan:
    facts = {h.name: facts_from_file(h) for h in fleet_file.hosts}
    return plan_fleet(fleet_file, LLAMA, facts, target=target).instances[0]


def test_a_third_engine_is_planned_by_the_shared_paths_with_its_own_figures(toy: Engine) -> None:
    plan = _plan(_fleet({"max-context": 8192}))
    assert (plan.engine, plan.rules) == ("toyllm", "toyllm-1") and plan.fits, plan.errors
    m = plan.memory
    budget = int(24 * GIB * 0.8)
    pages = (budget - LLAMA.weight_bytes) // (_cell(LLAMA, 1) * PAGE_TOKENS)
    assert ToyExtras.of(m) == ToyExtras(0.2, pages) and m.kv_tokens == pages * PAGE_TOKENS
    assert m.max_running_requests == min(DEFAULT_SEQS, m.kv_tokens // 8192)
    data = plan.to_json()  # the engine's figures nested in memory, and beside the common ones
    assert data["memory"]["extras"] == {"reserve_fraction": 0.2, "pages": pages} and data["pages"] == pages
    assert data["kv_tokens"] == m.kv_tokens and data["max_running_requests"] == m.max_running_requests


def test_the_plan_table_names_the_third_engines_own_rows(toy: Engine) -> None:
    out = io.StringIO()
    Console(file=out, width=200).print(_memory_table(_plan(_fleet({"max-context": 8192})), "toy"))
    text = out.getvalue()
    assert "reserve-fraction" in text and "toy pages" in text and "KV tokens" in text
    assert "mem fraction" not in text and "mem-fraction-static" not in text and "Mamba" not in text


def test_shared_fixes_and_targets_use_the_third_engines_flags(toy: Engine) -> None:
    """Its context flag for the halved context, its concurrency flag for a target, more GPUs: every way
    out re-sized by its own arithmetic."""
    refused = _plan(_fleet({"max-context": 65_536}))
    assert not refused.fits and [e.rule for e in refused.errors] == ["kv-cache"]
    by_args = {tuple(sorted(f.args)): f for f in refused.fixes}
    halved = by_args[("max-context", "max-seqs")]
    assert halved.args["max-context"] == 32_768 and "max-context 65536 → 32768" in halved.change
    again = _plan(_fleet({"max-context": 65_536, **halved.args}))
    assert again.fits and again.memory.max_running_requests == halved.max_running_requests
    assert any(f.tp == 2 for f in refused.fixes)
    solved = _plan(_fleet({"max-context": 8192}), target=3)
    assert solved.fixes[0].args == {"max-context": 8192, "max-seqs": 3}


def test_weights_over_the_budget_name_the_third_engines_setting(toy: Engine) -> None:
    plan = _plan(_fleet({"max-context": 8192}, gpu_gib=18))  # 16 GB of weights, a 14.4 GiB budget
    assert plan.errors[0].rule == "weights-exceed-gpu" and "(reserve-fraction 0.20)" in plan.errors[0].message
    assert ToyExtras.of(plan.memory).pages == 0 and plan.memory.kv_tokens == 0


def test_a_third_engine_launches_through_decide_launch_and_deploy(toy: Engine) -> None:
    fleet = _fleet({"ctx": 8192})  # its old flag name: translated by its own rule set's renames
    inst = fleet.instances()[0]
    launch = decide_launch(fleet.engine, inst, facts_from_file(fleet.hosts[0]))
    assert launch.rules.name == "toyllm-1" and launch.rule_warning is None
    bind = ("--host", "127.0.0.1", "--port", str(inst.port))
    assert launch.argv[1:] == ("-m", "toyllm.serve", "/m", "--max-context", "8192", "--tp", "1", *bind)
    plan = _plan(_fleet({"max-context": 8192}))
    survey = HostSurvey(workdir="/w", has_nvidia_smi=True, uptime_s=1.0, clk_tck=100, engine_version="1.2")
    wanted = build_wanted(fleet, get_engine("toyllm"), inst, survey, None, planned_figures(plan))
    assert wanted.launch.argv == launch.argv and "toyllm.serve" in wanted.script
    pages = ToyExtras.of(plan.memory).pages
    assert wanted.planned == {
        "kv_tokens": plan.memory.kv_tokens,
        "max_running_requests": plan.memory.max_running_requests,
        "toy_pages": pages,
    }
    log = [f"allocated {pages} pages", f"{pages * PAGE_TOKENS} KV tokens"]  # what `up` reads back
    assert toy.capacity(log, None, {}) == {k: wanted.planned[k] for k in ("toy_pages", "kv_tokens")}
    assert planner_of("toyllm") is TOY_PLANNER
