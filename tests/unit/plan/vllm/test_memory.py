"""vLLM's CPU build planned as it sizes itself: the KV space is `VLLM_CPU_KVCACHE_SPACE` GiB of host RAM
(vllm/platforms/cpu.py, v1/worker/cpu_worker.py of 0.32.0+cpu), blocks of 128 tokens, max-num-seqs 128 per
worker; GPU memory plays no part. The demo (scripts/demo.sh) runs this engine on the tiny model
(tests/data/models/tiny-qwen3: its config.json and the index scripts/build_tiny_model.py writes), so its `up`
prints planned next to actual; tests/integration/deploy/test_vllm.py checks the same plan against the real
engine."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.config import FleetFile
from fleetgen.deploy.wanted import planned_figures
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import InstancePlan, facts_from_file, plan_fleet
from fleetgen.plan.types import GIB
from fleetgen.plan.vllm.memory import VLLMExtras
from tests.fixtures.planmodels import MODELS, QWEN

TINY = load_model_shape(MODELS / "tiny-qwen3")
CPU = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def plan_vllm(
    args: dict[str, Any],
    env: dict[str, str],
    *,
    gpu_gib: float = 16.0,
    free_gib: float | None = None,
    model: Any = TINY,
) -> InstancePlan:
    """One vLLM instance of `model` with these flags and env, on a host whose GPU memory the file states."""
    host = {"name": "local", "gpus": [0], "gpu_memory_gib": gpu_gib, "gpu_free_gib": free_gib}
    fleet = FleetFile.model_validate(
        {"engine": {"kind": "vllm", "model": "/m", "args": args, "env": env}, "hosts": [host]}
    )
    return plan_fleet(fleet, model, {h.name: facts_from_file(h) for h in fleet.hosts}, None).instances[0]


def test_the_demo_instance_is_planned_as_vllm_cpu_sizes_it() -> None:
    """The demo's flags: 1 GiB of KV space over 2 layers × 2 KV heads × 64 dims × bf16 (K and V) = 1 KiB a
    token; 128-token blocks of both layers (128 KiB) → 8,192 blocks, 1,048,576 tokens, 16 blocks per
    2,048-token request → 512 requests at once, of which max-num-seqs (128) run."""
    plan = plan_vllm({"max-model-len": 2048, "enforce-eager": True}, CPU)
    m, vllm = plan.memory, VLLMExtras.of(plan.memory)
    per_token = 2 * 2 * 2 * 64 * 2
    assert TINY.weight_bytes == 1_312_512 and m.kv_bytes_per_token == per_token
    assert (vllm.block_size, vllm.num_blocks, vllm.cpu_kv_space_gib) == (128, GIB // (128 * per_token), 1)
    assert m.kv_tokens == 8192 * 128 == 1_048_576 and vllm.max_concurrency == 8192 / 16 == 512
    assert m.max_running_requests == 128 and plan.fits
    assert planned_figures(plan) == {"kv_tokens": 1_048_576, "max_running_requests": 512}
    assert [w.rule for w in plan.warnings if w.rule == "cpu"] == ["cpu"]


@given(
    space=st.integers(1, 64),
    ctx=st.integers(16, 4096),
    block=st.sampled_from([None, 16, 32, 128, 256]),
    gpu_gib=st.floats(0.5, 200),
    free_share=st.floats(0.001, 1),
)
def test_a_cpu_plan_fills_its_kv_space_with_whole_blocks_whatever_the_gpu(
    space: int, ctx: int, block: int | None, gpu_gib: float, free_share: float
) -> None:
    """The KV pool is the env's space in whole blocks (never more, less than one block short), every figure
    follows from it alone: the GPU's total or free memory (even almost none free) changes and refuses
    nothing."""
    args: dict[str, Any] = {"max-model-len": ctx} | ({"block-size": block} if block else {})
    env = {"VLLM_CPU_KVCACHE_SPACE": str(space)}
    plan = plan_vllm(args, env, gpu_gib=gpu_gib, free_gib=gpu_gib * free_share)
    m, vllm = plan.memory, VLLMExtras.of(plan.memory)
    block_bytes = vllm.block_size * m.kv_bytes_per_token
    assert vllm.block_size == (block or 128) and vllm.cpu_kv_space_gib == space
    assert (
        0 <= space * GIB - m.kv_pool_bytes < block_bytes and m.kv_pool_bytes == vllm.num_blocks * block_bytes
    )
    per_request = -(-ctx // vllm.block_size)
    assert vllm.max_concurrency == vllm.num_blocks / per_request
    assert m.kv_tokens == int(vllm.num_blocks / per_request * ctx) <= vllm.num_blocks * vllm.block_size
    assert plan.fits, plan.errors
    other = plan_vllm(args, env, gpu_gib=80.0).memory  # the GPU's own figures (free, headroom) echoed:
    assert replace(plan.memory, free_bytes=0, headroom_bytes=0) == replace(
        other, free_bytes=0, headroom_bytes=0
    )


def test_without_the_kv_space_the_gpu_arithmetic_plans_it() -> None:
    """Unset, empty or 0 (vLLM then sizes the space from free RAM at start): the GPU's utilization plans
    it."""
    for env in ({}, {"VLLM_CPU_KVCACHE_SPACE": ""}, {"VLLM_CPU_KVCACHE_SPACE": "0"}):
        vllm = VLLMExtras.of(plan_vllm({"max-model-len": 2048}, env).memory)
        assert (vllm.cpu_kv_space_gib, vllm.gpu_memory_utilization, vllm.block_size) == (0, 0.9, 16), env


def test_a_space_too_small_for_one_request_is_vllms_refusal_naming_the_env_var() -> None:
    """Qwen3.6-27B at 24 K tokens needs 1.67 GiB for one request: vLLM refuses to start in 1 GiB, and the fix
    is the CPU build's own knob, doubled (the cheapest way out, before a shorter context)."""
    plan = plan_vllm({"max-model-len": 24_576}, CPU, gpu_gib=80.0, model=QWEN)
    [error] = plan.errors
    assert error.rule == "kv-cache" and error.fix.startswith("raise VLLM_CPU_KVCACHE_SPACE")
    assert error.message.startswith("To serve at least one request with the model's max seq len (24576)")
    assert plan.fixes[0].env == {"VLLM_CPU_KVCACHE_SPACE": "2"} and plan.fixes[0].max_running_requests >= 1
