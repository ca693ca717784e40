"""The pure plan: exact byte counts, the motivating Qwen3.6-27B + MTP case per SGLang era, capacity numbers.

GPU sizes: "96 GB" = 97,887 MiB (RTX PRO 6000), "183 GB" = 183,359 MiB (B200); free = total (nothing else
running). Expected numbers are recomputed here from SGLang's formulas (reference §1.10), not copied from the
plan's output.

Filed under `plan/sglang/memory.py` (SGLang's arithmetic, planned through `plan.plan_fleet`); the
API key's way is `plan/fleet.py`'s. The models, GPU sizes, flag sets and `plan_one` it shares with other
plan tests are in tests/fixtures/planmodels.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetgen.config import FleetFile
from fleetgen.engines import get_engine
from fleetgen.engines.sglang import SGLangEngine
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.plan.fleet import api_key_way
from fleetgen.plan.sglang.memory import (
    LOAD_OVERHEAD_BYTES,
    SGLangExtras,
    cuda_context_bytes,
    kv_bytes_per_token,
    state_bytes_per_request,
)
from tests.fixtures.planmodels import EXTRA, GPU96, GPU183, MOTIVATING, QWEN, SPEC_V2, plan_one

GIB = 1 << 30


def test_qwen36_exact_bytes() -> None:
    assert state_bytes_per_request(QWEN, 1, "float32") == 153_944_064
    assert state_bytes_per_request(QWEN, 2, "float32") == 76_972_032
    assert state_bytes_per_request(QWEN, 1, "bfloat16") == 78_446_592
    assert kv_bytes_per_token(QWEN, 1, 2) == 65_536
    assert kv_bytes_per_token(QWEN, 8, 2) == kv_bytes_per_token(QWEN, 4, 2) == 16_384  # 4 KV heads replicated
    assert kv_bytes_per_token(QWEN, 1, 2, draft_layers=1) == 69_632  # 0.5.23 folds the MTP layer in


def test_motivating_case_is_refused_on_early_2026_with_the_engines_text() -> None:
    plan = plan_one(MOTIVATING)
    assert not plan.fits
    error = plan.errors[0]
    assert error.rule == "spec-no-buffer-radix"
    assert error.message == (
        "Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache "
        "when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, "
        "please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
    )
    assert "extra_buffer" in error.fix and "SGLANG_ENABLE_SPEC_V2" in error.fix
    first = plan.fixes[0]
    assert first.cost == 0 and first.args["mamba-scheduler-strategy"] == "extra_buffer"
    assert first.env == SPEC_V2 and first.max_running_requests > 0


def _early_expected(gpu_gib: float, max_mamba: int | None = None) -> tuple[int, int, int]:
    """SGLang 0.5.10 `handle_max_mamba_cache` + `_resolve_max_num_reqs`, written out independently."""
    free = gpu_gib * GIB - cuda_context_bytes(int(gpu_gib * GIB))
    weights = QWEN.weight_bytes - QWEN.mtp_weight_bytes + LOAD_OVERHEAD_BYTES  # the draft's: outside
    p = 153_944_064
    rest = free * 0.90 - weights - p * 48 * 4  # spec scratch first, with the uncapped 48 running requests
    slots = max_mamba if max_mamba is not None else int(rest * 0.9 / 1.9 // p)
    tokens = int(rest - slots * p) // 65_536
    return slots, tokens, min(48, slots // 5)  # extra_buffer + overlap (SPEC_V2=1): 5 slots per request


def test_extra_buffer_on_96gb_early_2026() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA}, env=SPEC_V2)
    assert plan.fits, plan.errors
    m, sg = plan.memory, SGLangExtras.of(plan.memory)
    slots, tokens, running = _early_expected(GPU96)
    assert (sg.mamba_slots, m.kv_tokens, m.max_running_requests) == (slots, tokens, running)
    assert sg.mamba_ratio == 5 and sg.spec_scratch_bytes == 153_944_064 * 48 * 4
    assert m.kv_tokens < m.context_length  # 262,144-token context: said, with the fix
    assert any(w.rule == "full-context" and "context-length" in w.fix for w in plan.warnings)


def test_without_spec_v2_env_extra_buffer_takes_4_slots() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA})
    assert SGLangExtras.of(plan.memory).mamba_ratio == 4
    assert any(w.rule == "spec-v2-env" for w in plan.warnings)


def test_max_mamba_cache_size_24() -> None:
    auto = plan_one({**MOTIVATING, **EXTRA}, env=SPEC_V2).memory
    fixed = plan_one({**MOTIVATING, **EXTRA, "max-mamba-cache-size": 24}, env=SPEC_V2).memory
    _, tokens, running = _early_expected(GPU96, max_mamba=24)
    fixed_slots = SGLangExtras.of(fixed).mamba_slots
    assert (fixed_slots, fixed.kv_tokens, fixed.max_running_requests) == (24, tokens, running)
    assert SGLangExtras.of(fixed).mamba_pool_bytes == 24 * 153_944_064
    # the ratio split gives 20: the 21st to 24th come out of the KV pool
    assert SGLangExtras.of(auto).mamba_slots == 20
    assert fixed.kv_tokens < auto.kv_tokens


def test_183gb_gives_more() -> None:
    small = plan_one({**MOTIVATING, **EXTRA}, env=SPEC_V2).memory
    big = plan_one({**MOTIVATING, **EXTRA}, env=SPEC_V2, gpu_gib=GPU183).memory
    slots, tokens, running = _early_expected(GPU183)
    assert (SGLangExtras.of(big).mamba_slots, big.kv_tokens, big.max_running_requests) == (
        slots,
        tokens,
        running,
    )
    assert big.max_running_requests > small.max_running_requests and big.kv_tokens > small.kv_tokens


def test_0_5_23_joint_solve_and_draft_inside() -> None:
    plan = plan_one({**MOTIVATING, "mamba-radix-cache-strategy": "extra_buffer"}, version="0.5.23")
    m, sg = plan.memory, SGLangExtras.of(plan.memory)
    p, d, rho = 153_944_064, 4, 5
    draft_tables = 2 * QWEN.vocab_size * QWEN.hidden_size * 2  # the MTP head's own embedding + LM head
    # target (as its load takes) + MTP draft weights inside the budget
    assert m.weights_bytes == QWEN.weight_bytes + LOAD_OVERHEAD_BYTES + draft_tables
    assert m.kv_bytes_per_token == 69_632
    held = (1024 + 523) << 20  # 0.5.17+: the tokenizer's CUDA-IPC pool for a multimodal model + its context
    free = GPU96 * GIB - cuda_context_bytes(int(GPU96 * GIB)) - held
    rest = free * 0.9 - m.weights_bytes - 100 * (1 << 20)
    budget = rest * 0.9 / 1.9
    slots = int((budget - p * (1 + d)) // (p * (1 + d / rho)))
    assert sg.mamba_slots == slots
    running = min(48, slots // rho)
    assert sg.spec_scratch_bytes == p * (running + 1) * d
    assert m.kv_tokens == int(rest - sg.spec_scratch_bytes - (slots + 1) * p) // 69_632
    assert m.max_running_requests == running


def test_0_5_23_auto_strategy_is_extra_buffer_and_renames_are_named() -> None:
    args = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer", "cuda-graph-max-bs": 32}
    plan = plan_one(args, version="0.5.23")
    renamed = {w.message.split()[0]: w for w in plan.warnings if w.rule == "renamed-flag"}
    assert set(renamed) == {"--mamba-scheduler-strategy", "--cuda-graph-max-bs"}
    assert "--mamba-radix-cache-strategy" in renamed["--mamba-scheduler-strategy"].fix
    assert "--cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill" in renamed["--cuda-graph-max-bs"].fix
    assert "--mamba-scheduler-strategy" not in plan.argv and "--cuda-graph-max-bs" not in plan.argv
    assert "--mamba-radix-cache-strategy" in plan.argv and "--cuda-graph-max-bs-decode" in plan.argv
    auto = plan_one(dict(MOTIVATING), version="0.5.23")
    assert auto.fits and auto.resolved["mamba_strategy"] == "extra_buffer"
    assert SGLangExtras.of(auto.memory).mamba_ratio == 5


def test_default_mem_fraction_matches_sglangs_formula_for_a_vlm() -> None:
    plan = plan_one({}, version="0.5.23", gpu_gib=81_559 / 1024)
    reserved = max(512 + 8192 * 1.5 + 1 / 8 * 1024 + 256 * 2, 10 * 1024)
    vlm = 0.95 * (1 - 0.1 * (24 * 1152**2 / (24 * 1024**2) - 1))
    mfs = SGLangExtras.of(plan.memory).mem_fraction_static
    assert mfs == pytest.approx(round((81_559 - reserved) / 81_559, 3) * vlm)


# SGLang's GPU tiers (`handle_gpu_memory_settings`): GPU GiB → (chunked prefill, decode graph max bs at
# tp < 4, at tp ≥ 4), written out from its table (T4; A100-40G/L40; H100; H20/H200; B200/MI300).
SGLANG_GPU_TIERS = {
    16: (2048, 8, 8),
    48: (4096, 32, 160),
    80: (8192, 256, 512),
    141: (8192, 256, 512),
    183: (16384, 512, 512),
    192: (16384, 512, 512),
}


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("gib", sorted(SGLANG_GPU_TIERS))
def test_default_mem_fraction_follows_sglangs_gpu_tiers(gib: int, tp: int) -> None:
    """With no --mem-fraction-static, SGLang reserves 512 MiB + 1.5 × chunked prefill + tp/8 GiB + 2 × decode
    graph bs (at least 10 GiB on a GPU over 60 GiB); the plan's fraction is SGLang's on every tier."""
    chunk, small_tp_bs, big_tp_bs = SGLANG_GPU_TIERS[gib]
    reserved = 512 + chunk * 1.5 + tp / 8 * 1024 + (small_tp_bs if tp < 4 else big_tp_bs) * 2
    if gib > 60:
        reserved = max(reserved, 10 * 1024)
    plan = plan_one({}, model="llama-3.1-8b", gpu_gib=gib, tp=tp)
    assert SGLangExtras.of(plan.memory).mem_fraction_static == round(
        (gib * 1024 - reserved) / (gib * 1024), 3
    )


def test_ssm_bfloat16_halves_the_state() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA, "mamba-ssm-dtype": "bfloat16"}, env=SPEC_V2)
    assert plan.memory.state_bytes_per_request == 78_446_592


def test_tp2_halves_state_and_kv() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA}, env=SPEC_V2, tp=2)
    assert plan.memory.state_bytes_per_request == 76_972_032
    assert plan.memory.kv_bytes_per_token == 32_768


def test_dense_model_has_no_mamba_pool() -> None:
    plan = plan_one({"mem-fraction-static": 0.85}, model="llama-3.1-8b", gpu_gib=80)
    m = plan.memory
    assert plan.fits and SGLangExtras.of(m).mamba_slots == 0 and m.state_bytes_per_request == 0
    assert m.kv_bytes_per_token == 8 * 256 * 32 * 2
    assert m.max_running_requests == min(
        max(min(int(m.kv_tokens / 131072 * 512), 4096), 2048), m.kv_tokens // 2
    )


def test_moe_hybrid_plans() -> None:
    plan = plan_one(
        {"mem-fraction-static": 0.9}, model="qwen3-next-80b-a3b", gpu_gib=GPU183, version="0.5.23"
    )
    assert plan.fits and SGLangExtras.of(plan.memory).mamba_slots > 0
    assert (
        plan.memory.state_bytes_per_request == ((128 * 32 + 2 * 16 * 128) * 3 * 2 + 32 * 128 * 128 * 4) * 36
    )


def test_json_has_the_keys_and_integer_bytes() -> None:
    data = plan_one({**MOTIVATING, **EXTRA}, env=SPEC_V2).to_json()
    for key in (
        "instance",
        "host",
        "gpus",
        "engine",
        "rules",
        "weights_bytes",
        "kv_bytes_per_token",
        "state_bytes_per_request",
        "mamba_slots",
        "spec_scratch_bytes",
        "kv_tokens",
        "max_running_requests",
        "fits",
        "errors",
        "warnings",
        "argv",
        "env",
    ):
        assert key in data
    for key in (
        "weights_bytes",
        "kv_bytes_per_token",
        "state_bytes_per_request",
        "spec_scratch_bytes",
        "kv_tokens",
    ):
        assert isinstance(data[key], int)
    assert data["rules"] == "sglang-0.5.10" and data["env"]["CUDA_VISIBLE_DEVICES"] == "0"


def _public(kind: str, args: dict[str, Any]) -> FleetFile:
    return FleetFile.model_validate(
        {
            "engine": {"kind": kind, "model": "/m", "bind": "0.0.0.0", "api_key_env": "K", "args": args},
            "hosts": [{"name": "n", "gpus": [0], "gpu_memory_gib": GPU183}],
        }
    )


def test_plan_says_how_a_public_key_reaches_the_engine() -> None:
    """Never on the argv: vLLM and SGLang both have a way (no issue); SGLang's `--config` cannot also be the
    user's own (error, the fix moves its options); an engine with no way at all is warned about."""
    for kind in ("sglang", "vllm"):
        assert api_key_way(_public(kind, {}), get_engine(kind)) == ([], [])
    [error], [] = api_key_way(_public("sglang", {"config": "/mine.yaml"}), get_engine("sglang"))
    assert error.rule == "api-key" and "--config" in error.message and "engine.args" in error.fix
    fleet = _public("sglang", {"config": "/mine.yaml"})
    plan = plan_fleet(fleet, QWEN, {h.name: facts_from_file(h) for h in fleet.hosts}, None)
    assert not plan.fits and [e.rule for e in plan.errors] == ["api-key"]

    class NoWay(SGLangEngine):
        api_key_config_flag = None

    [], [warning] = api_key_way(_public("sglang", {}), NoWay())
    assert "argv" in warning.message and "`ps`" in warning.message and "127.0.0.1" in warning.fix
