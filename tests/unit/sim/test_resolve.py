"""fleetgen.sim's startup rules (SGLang 0.5.23 texts) and pool arithmetic.

Filed under `sim/resolve.py`, with `sim/memory.py`'s pools."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fleetgen.sim.flags import build_parser
from fleetgen.sim.memory import MemoryInputs, compute_capacity, mamba_ratio
from fleetgen.sim.model import DEFAULT_SHAPE, ModelShape
from fleetgen.sim.resolve import Resolution, StartupRuleError, resolve

DENSE = dataclasses.replace(
    DEFAULT_SHAPE,
    architecture="Qwen3ForCausalLM",
    num_hidden_layers=36,
    num_full_attention_layers=36,
    num_key_value_heads=8,
    head_dim=128,
    weights_gib=15.3,
    context_len=40960,
)


def resolved(*argv: str, shape: ModelShape = DEFAULT_SHAPE, gpu_gib: float = 80.0) -> Resolution:
    ns = build_parser().parse_args(["--model-path", "/m", *argv])
    raw: dict[str, Any] = {k: v for k, v in vars(ns).items() if not k.startswith("sim_")}
    return resolve(raw, shape, gpu_gib)


def test_defaults_follow_gpu_memory() -> None:
    args = resolved().args
    assert args["chunked_prefill_size"] == 8192 and args["cuda_graph_max_bs_decode"] == 256
    # reserved = max(512 + 8192*1.5 + 128 + 256*2, 10240) = 13440 MB of 81920 MB
    assert args["mem_fraction_static"] == round((81920 - 13440) / 81920, 3)
    assert args["served_model_name"] == "/m"


def test_nextn_becomes_eagle_with_auto_params() -> None:
    res = resolved("--speculative-algorithm", "NEXTN")
    args = res.args
    assert args["speculative_algorithm"] == "EAGLE"
    steps = (
        args["speculative_num_steps"],
        args["speculative_eagle_topk"],
        args["speculative_num_draft_tokens"],
    )
    assert steps == (3, 1, 4)
    assert args["max_running_requests"] == 48
    assert any("Max running requests is reset to 48" in w for w in res.warnings)


def test_topk_one_forces_draft_tokens() -> None:
    res = resolved(
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "7",
    )
    assert res.args["speculative_num_draft_tokens"] == 3
    assert any("adjusted to speculative_num_steps + 1" in w for w in res.warnings)


def test_unknown_speculative_algorithm() -> None:
    with pytest.raises(StartupRuleError) as info:
        resolved("--speculative-algorithm", "MEDUSA")
    assert (info.value.kind, info.value.text) == ("ValueError", "Unknown speculative algorithm name: MEDUSA")


def test_hybrid_auto_strategy_resolves_by_overlap() -> None:
    assert resolved().args["mamba_radix_cache_strategy"] == "extra_buffer"
    args = resolved("--disable-overlap-schedule").args
    assert args["mamba_radix_cache_strategy"] == "no_buffer"


def test_explicit_no_buffer_with_overlap_is_refused() -> None:
    with pytest.raises(StartupRuleError) as info:
        resolved("--mamba-radix-cache-strategy", "no_buffer")
    assert info.value.kind == "AssertionError"
    assert (
        info.value.text
        == "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
    )


def test_extra_buffer_on_dense_model_is_refused() -> None:
    with pytest.raises(StartupRuleError) as info:
        resolved("--mamba-radix-cache-strategy", "extra_buffer", shape=DENSE)
    assert (
        info.value.text
        == "--mamba-radix-cache-strategy extra_buffer needs mamba state, got Qwen3ForCausalLM."
    )


def test_extra_buffer_with_disabled_radix_cache_is_accepted_in_0_5_23() -> None:
    """0.5.23 dropped the old ValueError: without radix cache the strategy is simply unused."""
    args = resolved("--mamba-radix-cache-strategy", "extra_buffer", "--disable-radix-cache").args
    assert args["mamba_radix_cache_strategy"] == "extra_buffer"


def inputs(**changes: Any) -> MemoryInputs:
    base = MemoryInputs(
        gpu_gib=80.0,
        mem_fraction_static=0.836,
        tp_size=1,
        context_len=262144,
        max_running_requests=None,
        max_total_tokens=None,
        max_mamba_cache_size=None,
        mamba_full_memory_ratio=0.9,
        num_draft_tokens=0,
        radix_cache=True,
        extra_buffer=True,
        overlap=True,
        ssm_dtype_bytes=4,
    )
    return dataclasses.replace(base, **changes)


def test_state_per_request_matches_reference_arithmetic() -> None:
    conv, ssm = DEFAULT_SHAPE.mamba_state_bytes(tp_size=1)
    assert conv + ssm == 153_944_064  # 48 GDN layers x (61,440 conv + 3,145,728 SSM) bytes
    assert DEFAULT_SHAPE.kv_bytes_per_token(tp_size=1) == 65_536


def test_capacity_is_consistent() -> None:
    cap = compute_capacity(inputs(), DEFAULT_SHAPE)
    assert mamba_ratio(inputs()) == 5
    assert cap.max_running_requests == cap.mamba_cache_size // 5
    used = cap.weights_gib + cap.kv_k_gib + cap.kv_v_gib + cap.mamba_conv_gib + cap.mamba_ssm_gib
    assert used == pytest.approx((80.0 - 0.6) * 0.836, rel=1e-3)


def test_more_memory_more_tokens() -> None:
    small = compute_capacity(inputs(), DEFAULT_SHAPE)
    big = compute_capacity(inputs(gpu_gib=141.0), DEFAULT_SHAPE)
    assert big.max_total_num_tokens > small.max_total_num_tokens
    assert big.max_running_requests > small.max_running_requests


def test_weights_that_do_not_fit_raise_sglang_value_error() -> None:
    with pytest.raises(ValueError, match=r"^Loaded weights leave no GPU memory for the KV cache under "):
        compute_capacity(inputs(gpu_gib=40.0), DEFAULT_SHAPE)


def test_dense_model_has_no_mamba_pool() -> None:
    cap = compute_capacity(inputs(context_len=40960, extra_buffer=False), DENSE)
    assert cap.mamba_cache_size == 0
    assert cap.max_running_requests == 4096  # the estimate's cap: tokens/context*512 is above it
