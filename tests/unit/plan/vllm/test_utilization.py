"""vLLM's `--gpu-memory-utilization` searched as SGLang's static fraction is (`plan.vllm.throughput`,
`plan.vllm.memory.largest_safe_utilization`): vLLM profiles activations and CUDA graphs inside
utilization × total, so a higher fraction grows its KV pool; what it must leave is its own CUDA context
(taken before it checks free memory against the request) and the graph pool past its estimate."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.plan.planners import planner_of
from fleetgen.plan.throughput import plan_job
from fleetgen.plan.types import GIB
from fleetgen.plan.vllm.memory import (
    GRAPH_BYTES,
    UNPROFILED_GRAPH_SHARE,
    VLLM_CONTEXT_BYTES,
    VLLMExtras,
    largest_safe_utilization,
)
from tests.unit.plan.test_real_engines import tune_job
from tests.unit.plan.test_throughput import job, vllm_ask

VLLM = planner_of("vllm")


@given(total_gib=st.floats(20, 300), used_gib=st.floats(0, 30), eager=st.booleans())
def test_the_largest_safe_utilization_leaves_what_vllm_does_not_profile_and_a_hundredth_more_would_not(
    total_gib: float, used_gib: float, eager: bool
) -> None:
    total = int(total_gib * GIB)
    args = {"enforce-eager": True} if eager else {}
    a = replace(vllm_ask(args), total_bytes=total, free_bytes=max(total - int(used_gib * GIB), 0))
    f = largest_safe_utilization(a)
    graphs = 0 if eager else GRAPH_BYTES * UNPROFILED_GRAPH_SHARE
    assert f == round(f, 2) and 0.0 <= f <= 0.99
    if f > 0:
        assert total * f <= a.free_bytes - VLLM_CONTEXT_BYTES and total * (1 - f) >= graphs - 1
    if 0 < f < 0.99:
        more = f + 0.01
        assert total * more > a.free_bytes - VLLM_CONTEXT_BYTES or total * (1 - more) < graphs


@settings(max_examples=15, deadline=None)
@given(
    gib=st.sampled_from([80, 141]),
    util=st.sampled_from([0.8, 0.9, 0.92]),
    output=st.integers(300, 4000),
    spec=st.booleans(),
)
def test_every_higher_utilization_offered_is_safe_and_runs_more_than_the_same_flags_below_it(
    gib: int, util: float, output: int, spec: bool
) -> None:
    args: dict[str, object] = {"gpu-memory-utilization": util}
    if spec:
        args["speculative-config"] = '{"method": "mtp", "num_speculative_tokens": 3}'
    a = vllm_ask(args, gib)
    plan = plan_job(VLLM, a, VLLM.size(a), job(output=output))
    top = largest_safe_utilization(a)
    searched = [s for s in plan.settings if "-gmu" in s.name]
    for s in searched:
        f = float(s.args["gpu-memory-utilization"])
        assert util < f <= top and f"--gpu-memory-utilization {f:.2f}" in s.change
        sized = VLLM.size(replace(a, args=s.args))
        assert sized.fits and VLLMExtras.of(sized.memory).gpu_memory_utilization == f
        below = [
            o.running
            for o in plan.settings[1:]
            if "-gmu" not in o.name and o.is_spec == s.is_spec and not o.numerics
        ]
        assert s.running > max(below, default=0)  # only where the fraction runs more


def test_the_h200_tune_fleet_searches_up_to_the_safe_utilization() -> None:
    """vLLM 0.24 on the H200 at 0.9 (the tune job): the search offers 0.98, where 331 run (286 at 0.90)."""
    a = vllm_ask({"gpu-memory-utilization": 0.9}, 141)
    plan = plan_job(VLLM, a, VLLM.size(a), tune_job())
    names = [s.name for s in plan.settings]
    best = plan.best
    assert best.args["gpu-memory-utilization"] == largest_safe_utilization(a) == 0.98
    assert best.running > max(s.running for s in plan.settings if "-gmu" not in s.name and not s.numerics)
    assert any(n.endswith("-gmu98-mtp") for n in names)
