"""Weights that alone exceed the GPU: the plan names that cause (weights vs GPU, both numbers), offers only
the ways out that help (more GPUs per instance, FP8 weights) and never prints the negative pools the engine
arithmetic reaches on the way (issue 10 item 13: "max_mamba_cache_size=-317", "-22.74 GiB").

Filed under `plan/instance.py` (an instance's size and the cause it names)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.config import FleetFile
from fleetgen.modelcard import ModelShape, load_model_shape
from fleetgen.plan import FleetPlan, facts_from_file, plan_fleet
from fleetgen.plan.sglang.memory import SGLangExtras

MODELS = Path(__file__).parents[2] / "data" / "models"
SHAPES = {
    name: load_model_shape(MODELS / name) for name in ("qwen3-next-80b-a3b", "qwen3.6-27b", "llama-3.1-8b")
}
GIB = 1 << 30
NEGATIVE = re.compile(r"(?<![\w.])-\d")  # a minus sign before a digit (not "qwen3-next", not "fp8_e4m3")


def plan(
    shape: ModelShape, kind: str, version: str, tp: int, gpu_gib: float, args: dict[str, Any] | None = None
) -> FleetPlan:
    fleet = FleetFile.model_validate(
        {
            "engine": {"kind": kind, "version": version, "model": "/m", "tp": tp, "args": args or {}},
            "hosts": [{"name": "n", "gpus": list(range(tp)), "gpu_memory_gib": gpu_gib}],
        }
    )
    return plan_fleet(fleet, shape, {h.name: facts_from_file(h) for h in fleet.hosts}, None)


def numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers(v)]
    return []


ENGINES = st.sampled_from(
    [("sglang", "0.5.23"), ("sglang", "0.5.10"), ("sglang", "0.5.7"), ("vllm", "0.11.0")]
)


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(sorted(SHAPES)),
    engine=ENGINES,
    tp=st.sampled_from([1, 2]),
    gpu_gib=st.sampled_from([24.0, 40.0, 48.0, 80.0, 96.0, 141.0]),
    over=st.floats(1.01, 6.0),
)
def test_weights_beyond_the_gpu_name_the_cause_and_rank_tp_or_fp8_first(
    model: str, engine: tuple[str, str], tp: int, gpu_gib: float, over: float
) -> None:
    base = SHAPES[model]
    weights = int(gpu_gib * GIB * over * tp) + base.mtp_weight_bytes  # per GPU: `over` × the GPU (+ MTP)
    shape = dataclasses.replace(base, weight_bytes=weights)
    kind, version = engine
    result = plan(shape, kind, version, tp, gpu_gib)
    p = result.instances[0]
    assert not p.fits and not result.fits
    cause = p.errors[0]
    per_gpu = p.memory.weights_bytes / GIB
    assert cause.rule == "weights-exceed-gpu"
    assert f"{per_gpu:.1f} GiB per GPU (tp = {tp})" in cause.message
    assert f"; the GPU has {gpu_gib:.1f} GiB" in cause.message
    assert "tp" in cause.fix and "FP8" in cause.fix
    assert not any(e.rule in ("mamba-pool", "kv-cache") for e in p.errors)  # consequences, not causes
    for fix in p.fixes:  # nothing else can fit: every way out is more GPUs or smaller weights
        assert fix.tp > tp or fix.args.get("quantization") == "fp8", fix
    if per_gpu / 16 < gpu_gib * 0.3 and len(p.errors) == 1:  # tp × 16 leaves room: a fix is offered
        assert p.fixes
    for fix in p.fixes:  # and each really fits, re-planned with the same arithmetic
        again = plan(shape, kind, version, fix.tp or tp, gpu_gib, dict(fix.args)).instances[0]
        assert again.fits and again.memory.max_running_requests == fix.max_running_requests
    data = p.to_json()
    assert min(numbers(data)) >= 0
    text = json.dumps(data)
    assert not NEGATIVE.search(text), NEGATIVE.search(text)


def test_the_issue_case_qwen3_next_on_80_gib() -> None:
    """The reported case: Qwen3-Next-80B in bf16 (148 GiB) on one 80 GiB GPU → tp = 4 (tp = 2 leaves 74 GiB
    of weights per GPU: no room for the pools), and no negative Mamba pool anywhere."""
    p = plan(SHAPES["qwen3-next-80b-a3b"], "sglang", "0.5.23", 1, 80.0).instances[0]
    assert [e.rule for e in p.errors] == ["weights-exceed-gpu"]
    assert "148.7 GiB per GPU (tp = 1); the GPU has 80.0 GiB" in p.errors[0].message
    assert p.fixes and p.fixes[0].tp == 4 and p.fixes[0].change.startswith("tp = 4")
    sg = SGLangExtras.of(p.memory)
    assert sg.mamba_slots == 0 and sg.mamba_pool_bytes == 0


def test_weights_that_fit_the_gpu_but_not_the_budget_say_so() -> None:
    """60 GiB of weights on an 64 GiB GPU: under the GPU, over SGLang's static budget."""
    shape = dataclasses.replace(SHAPES["llama-3.1-8b"], weight_bytes=60 * GIB)
    p = plan(shape, "sglang", "0.5.23", 1, 64.0).instances[0]
    assert p.errors[0].rule == "weights-exceed-gpu"
    assert "; the engine's static budget is" in p.errors[0].message
    assert all(f.tp > 1 or f.args.get("quantization") == "fp8" for f in p.fixes) and p.fixes
