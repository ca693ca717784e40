"""SGLang's behaviour per release, as a per-feature timeline read from each release's own source (pure data).

Every release 0.5.7 … 0.5.23 (and the .post releases) was read from its wheel
(`pip download --no-deps sglang==X`). `TIMELINE` lists, per feature, the value it has from the first release
where it holds until the next entry of the same feature; the rule set of a release is every feature's latest
value at or before it (`rules_for`). Paths below are inside the wheel, `sglang/srt/`. Upstream's dated
main-branch history (the reference, §0) does not map 1:1 to releases: the wheels decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fleetgen.engines.rules import FlagRename, RuleSet, release

# Every release whose source was read, oldest first: 0.5.7 … 0.5.23, and the .post1 of five of them. A release
# not listed gets the nearest (warned).
_WITH_POST1 = (8, 10, 12, 13, 15)
RELEASES: tuple[str, ...] = tuple(
    v for n in range(7, 24) for v in (f"0.5.{n}", f"0.5.{n}.post1")[: 2 if n in _WITH_POST1 else 1]
)

QWEN3_5_ARCHS = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})

# The string switches of `SGLangRules`, one value per behaviour a release has (mypy refuses a comparison with
# a value outside them; `TIMELINE`'s values are checked against them by test_sglang_timeline).
# spec + no_buffer + radix cache: "unchecked" (accepted as is), "radix_off" (warning, radix cache silently
# disabled), "raises" (ValueError), "gone" (the check no longer exists)
SpecNoBufferRadix = Literal["unchecked", "radix_off", "raises", "gone"]
MambaRatioRule = Literal["by-spec-quirk", "by-spec", "by-overlap"]  # Mamba slots per request
MambaPoolSolve = Literal["ratio-scratch", "scratch-first-512", "scratch-first", "joint", "joint-padded"]
MaxRunningCap = Literal["none", "estimate", "half-tokens"]  # what caps an explicit --max-running-requests


@dataclass(frozen=True)
class SGLangRules(RuleSet):
    """How one SGLang release validates flags and sizes memory: the generic rule set (flag names) plus the
    switches `fleetgen.plan.sglang` and the log watcher read, each set per release by `TIMELINE`."""

    strategy_flag: str = ""  # the Mamba strategy's flag name in this release
    # --- startup checks --------------------------------------------------------------------------------
    spec_no_buffer_radix: SpecNoBufferRadix = "gone"  # spec + no_buffer + radix cache
    rejects_extra_buffer_without_radix: bool = False  # ValueError; other releases ignore extra_buffer
    explicit_no_buffer_needs_no_overlap: bool = False  # asserts instead of turning overlap off
    track_interval_text: bool = True  # False: a bare `assert` (AssertionError without a message)
    missing_archs: frozenset[str] = frozenset()  # architectures this release has no model for
    hicache_hybrid: bool = True  # the hierarchical cache keeps a Mamba host pool (HiMambaRadixCache)
    # --- speculative worker ----------------------------------------------------------------------------
    spec_v2_env: str = ""  # env var that selects the overlap (v2) spec worker, "" when it no longer exists
    spec_v2_default: bool = False
    spec_v2_removed_warning: bool = False  # the release logs that SGLANG_ENABLE_SPEC_V2 was removed
    default_spec_max_running: int = 48
    # --- memory semantics ------------------------------------------------------------------------------
    spec_reserve_mb: int = 0  # extra headroom the default mem-fraction formula keeps for EAGLE/MTP
    gpu_tier_35g: tuple[int, int, int] = (4096, 48, 160)  # 20–35 GiB GPUs: chunk, max bs tp<4, tp>=4
    draft_weights_in_budget: bool = False
    draft_kv_in_budget: bool = False
    # an MTP head without --speculative-draft-model-path also gets its KV in the cell (else: its own pool,
    # out of the headroom); 0.5.14–0.5.18 count only a draft with a path (`eagle_draft_num_layers`)
    pathless_draft_kv_in_budget: bool = True
    mamba_ratio_rule: MambaRatioRule = "by-overlap"
    mamba_pool_solve: MambaPoolSolve = "joint-padded"
    mamba_oom_errors: bool = False  # explicit errors when the Mamba pool gets no slot / serves nothing
    mrr_cap: MaxRunningCap = "half-tokens"  # an explicit --max-running-requests is capped by it
    vlm_cache_reserve_mb: int = 0  # multimodal embedding cache reserved out of the KV budget
    # the tokenizer's CUDA-IPC pool for multimodal features (MiB, SGLANG_MM_FEATURE_CACHE_MB's default), held
    # on the GPU before the scheduler measures its free memory where the transport resolves to cuda_ipc
    mm_ipc_pool_mb: int = 0
    auto_strategy_extra_buffer: bool = False  # `auto` resolves to extra_buffer when overlap is on
    # --- throughput ------------------------------------------------------------------------------------
    has_linear_replayssm: bool = False  # --enable-linear-replayssm (no_buffer, Triton linear-attn decode)
    # --enable-linear-replayssm-spec: the spec verify folds a per-slot raw-input window instead of keeping
    # per-draft SSM snapshots (the intermediate SSM cache is not allocated); linear chain (topk ≤ 1) only
    has_linear_replayssm_spec: bool = False
    # SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK: the radix cache leaves a decoding request's matched Mamba prefix
    # evictable, one slot fewer per running request with extra_buffer (ρ 5 → 4 with overlap)
    has_skip_decode_lock: bool = False
    # the prefill CUDA graph (breakable backend) captured by default only where ≥ 4 GiB is left after the
    # pools: a lower static fraction crosses the gate and captures it (0.5.17 on an H100 died so with the
    # replayed SSM decode at 0.91: tests/data/real-engines/sglang-0.5.17-h100-mmcpu-tune/)
    auto_prefill_graph_gate: bool = False


def sglang_rules(rules: RuleSet) -> SGLangRules:
    """`rules` as SGLang's: every rule set an SGLang instance is planned or watched with is one of `RULE_SETS`
    (`select_rule_set` picks among the engine's own)."""
    assert isinstance(rules, SGLangRules), f"{rules.name} is not an SGLang rule set"
    return rules


# Flag names by release: ≤0.5.13.post1 only the old names exist; 0.5.14–0.5.19 add the new names and keep
# the old ones as `DeprecatedAliasStoreAction`s; from 0.5.20 flags come from dataclass fields and the old
# names are gone (argparse: "unrecognized arguments" / "ambiguous option: --cuda-graph-max-bs could match
# --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" — seen running 0.5.23's parser).
_TO_OLD = (
    FlagRename("mamba-radix-cache-strategy", ("mamba-scheduler-strategy",), "named so before 0.5.14"),
    FlagRename("cuda-graph-max-bs-decode", ("cuda-graph-max-bs",), "named so before 0.5.14"),
)
_OLD_ALIASES = (
    FlagRename(
        "mamba-scheduler-strategy",
        ("mamba-radix-cache-strategy",),
        "a deprecated alias from 0.5.14, removed in 0.5.20",
        still_accepted=True,
    ),
    FlagRename(
        "cuda-graph-max-bs",
        ("cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill"),
        "a deprecated alias of -decode from 0.5.14, removed in 0.5.20",
        still_accepted=True,
    ),
)
_OLD_REMOVED = (
    FlagRename(
        "mamba-scheduler-strategy", ("mamba-radix-cache-strategy",), "renamed in 0.5.14, alias gone in 0.5.20"
    ),
    FlagRename(
        "cuda-graph-max-bs",
        ("cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill"),
        "split in 0.5.14, alias gone in 0.5.20 (the old name is an ambiguous prefix of both)",
    ),
)
_NO_PREFILL_BS = {"cuda-graph-max-bs-prefill": "no prefill cuda-graph batch limit before 0.5.14; remove it"}
_DISABLE_CUDA_GRAPH = {
    "disable-cuda-graph": "deprecated since 0.5.14 (still parsed): use cuda-graph-backend-decode = "
    '"disabled" and cuda-graph-backend-prefill = "disabled"'
}


@dataclass(frozen=True)
class Change:
    """From release `first` on, `feature` (an `SGLangRules` field) has `value`; `source`: where it is read."""

    feature: str
    first: str
    value: Any
    source: str


TIMELINE: tuple[Change, ...] = (
    # --- flags -------------------------------------------------------------------------------------------
    Change("strategy_flag", "0.5.7", "mamba-scheduler-strategy", "server_args.py add_cli_args"),
    Change("strategy_flag", "0.5.14", "mamba-radix-cache-strategy", "server_args.py add_cli_args"),
    Change("renames", "0.5.7", _TO_OLD, "server_args.py add_cli_args: no -radix-cache-/-decode flags"),
    Change("renames", "0.5.14", _OLD_ALIASES, "server_args.py: DeprecatedAliasStoreAction(new_flag=...)"),
    Change("renames", "0.5.20", _OLD_REMOVED, "server_args.py: flags from arg_groups/fields, aliases gone"),
    Change("removed_flags", "0.5.7", _NO_PREFILL_BS, "server_args.py add_cli_args"),
    Change("removed_flags", "0.5.14", {}, "server_args.py add_cli_args: --cuda-graph-max-bs-prefill"),
    Change("deprecated_flags", "0.5.14", _DISABLE_CUDA_GRAPH, "server_args.py: DeprecatedStoreTrueAction"),
    # --- startup checks ----------------------------------------------------------------------------------
    # ≤0.5.8: no spec check for Qwen3Next (only NemotronH drops radix); 0.5.9: _handle_mamba_radix_cache
    # warns "Disabling radix cache since speculative decoding …" and drops it; 0.5.10: ValueError;
    # 0.5.14: the function is rewritten (_validate_mamba_no_buffer) and the check is gone.
    Change("spec_no_buffer_radix", "0.5.7", "unchecked", "server_args.py _handle_model_specific_adjustments"),
    Change("spec_no_buffer_radix", "0.5.9", "radix_off", "server_args.py _handle_mamba_radix_cache"),
    Change("spec_no_buffer_radix", "0.5.10", "raises", "server_args.py _handle_mamba_radix_cache"),
    Change("spec_no_buffer_radix", "0.5.14", "gone", "server_args.py _handle_mamba_radix_cache"),
    Change("rejects_extra_buffer_without_radix", "0.5.10", True, "server_args.py _handle_mamba_radix_cache"),
    Change("rejects_extra_buffer_without_radix", "0.5.14", False, "server_args.py: returns if radix off"),
    Change("explicit_no_buffer_needs_no_overlap", "0.5.14", True, "server_args.py _validate_mamba_no_buffer"),
    Change("track_interval_text", "0.5.14", False, "server_args.py _validate_mamba_extra_buffer"),
    Change("missing_archs", "0.5.7", QWEN3_5_ARCHS, "models/: no qwen3_5.py before 0.5.9"),
    Change("missing_archs", "0.5.9", frozenset(), "models/qwen3_5.py, qwen3_5_mtp.py"),
    Change("hicache_hybrid", "0.5.7", False, "managers/scheduler.py: HiRadixCache for hybrid models"),
    Change("hicache_hybrid", "0.5.10", True, "mem_cache/hi_mamba_radix_cache.py HiMambaRadixCache"),
    # --- speculative worker ------------------------------------------------------------------------------
    Change("spec_v2_env", "0.5.7", "SGLANG_ENABLE_SPEC_V2", "environ.py EnvBool(False)"),
    Change("spec_v2_default", "0.5.11", True, "environ.py EnvBool(True)"),
    Change("spec_v2_env", "0.5.14", "", "environ.py: removed; server_args.py warns when it is set"),
    Change("spec_v2_default", "0.5.14", False, "environ.py: removed"),
    Change("spec_v2_removed_warning", "0.5.14", True, "server_args.py: '… has been removed'"),
    Change("spec_v2_removed_warning", "0.5.21", False, "no mention of SGLANG_ENABLE_SPEC_V2 left"),
    # --- memory ------------------------------------------------------------------------------------------
    Change("spec_reserve_mb", "0.5.7", 2048, "server_args.py _handle_gpu_memory_settings: EAGLE +2 GB"),
    Change("spec_reserve_mb", "0.5.10", 4096, "server_args.py _handle_gpu_memory_settings: EAGLE +4 GB"),
    Change("spec_reserve_mb", "0.5.14", 0, "server_args.py _handle_gpu_memory_settings"),
    Change("gpu_tier_35g", "0.5.7", (2048, 24, 80), "server_args.py _handle_gpu_memory_settings"),
    Change("gpu_tier_35g", "0.5.20", (4096, 48, 160), "arg_groups/memory_hook.py"),
    Change("draft_weights_in_budget", "0.5.14", True, "'draft weights are now counted' (kv profiling)"),
    Change("draft_kv_in_budget", "0.5.14", True, "pool_configurator.py eagle_draft_num_layers"),
    # 0.5.15 `ModelRunner.__init__` sets eagle_draft_num_layers only with a speculative_draft_model_path:
    # a path-less MTP head (Qwen3.5/3.6) keeps its own KV pool outside the budget: two "KV Cache is allocated"
    # lines on a real H200 (tests/data/real-engines/sglang-0.5.15-h200/mtp); still gated in 0.5.16–0.5.18.
    Change("pathless_draft_kv_in_budget", "0.5.14", False, "model_runner.py eagle_draft_num_layers"),
    Change("pathless_draft_kv_in_budget", "0.5.19", True, "spec_aux_hidden_state.py: sized off the target"),
    # ≤0.5.9 `init_memory_pool`: extra_buffer → 4 with spec, else 5 — and 0.5.7 gives no_buffer 5 too;
    # 0.5.10 `_calculate_mamba_ratio`: by overlap (extra_buffer 5 with overlap, 4 without; no_buffer 3).
    Change("mamba_ratio_rule", "0.5.7", "by-spec-quirk", "model_runner_kv_cache_mixin.py init_memory_pool"),
    Change("mamba_ratio_rule", "0.5.8", "by-spec", "model_runner_kv_cache_mixin.py init_memory_pool"),
    Change("mamba_ratio_rule", "0.5.10", "by-overlap", "…kv_cache_mixin.py _calculate_mamba_ratio"),
    # handle_max_mamba_cache: 0.5.7 spec scratch only in the ratio branch (+512 slots without radix and MRR);
    # 0.5.8 scratch first (P·MRR·D, uncapped); 0.5.9 explicit / no-radix+MRR / ratio; 0.5.13 joint solve;
    # 0.5.17 joint solve with the pool's padding slot (kv_cache_configurator.py _handle_max_mamba_cache).
    Change("mamba_pool_solve", "0.5.7", "ratio-scratch", "…kv_cache_mixin.py handle_max_mamba_cache"),
    Change("mamba_pool_solve", "0.5.8", "scratch-first-512", "model_runner_kv_cache_mixin.py"),
    Change("mamba_pool_solve", "0.5.9", "scratch-first", "model_runner_kv_cache_mixin.py"),
    Change("mamba_pool_solve", "0.5.13", "joint", "…kv_cache_mixin.py handle_max_mamba_cache"),
    Change("mamba_pool_solve", "0.5.17", "joint-padded", "mem_cache/kv_cache_configurator.py"),
    Change("mamba_oom_errors", "0.5.13", True, "'Not enough GPU memory for hybrid …', 'too small to serve'"),
    # an explicit --max-running-requests: ≤0.5.9 kept as is (model_runner.py), 0.5.10 min(MRR, estimate)
    # (_resolve_max_num_reqs), 0.5.14 min(MRR, tokens // 2)
    Change("mrr_cap", "0.5.7", "none", "model_executor/model_runner.py init max_running_requests"),
    Change("mrr_cap", "0.5.10", "estimate", "model_runner_kv_cache_mixin.py _resolve_max_num_reqs"),
    Change("mrr_cap", "0.5.14", "half-tokens", "model_runner_kv_cache_mixin.py _resolve_max_num_reqs"),
    Change("vlm_cache_reserve_mb", "0.5.18", 100, "kv_cache_configurator.py mm_runtime_reservation_gb"),
    # 0.5.17 server_args.py `_handle_mm_feature_transport`: `auto` resolves to cuda_ipc on one CUDA node (not
    # encoder-only, not disaggregated); base_processor.py then reserves SGLANG_MM_FEATURE_CACHE_MB (1024) on
    # the base GPU: "CUDA IPC multimodal feature pools reserve 1024 MiB total on GPU 0"
    Change("mm_ipc_pool_mb", "0.5.17", 1024, "server_args.py _handle_mm_feature_transport"),
    Change("auto_strategy_extra_buffer", "0.5.14", True, "server_args.py _handle_mamba_radix_cache"),
    # the replayed SSM decode: absent from 0.5.14's source, in 0.5.15's server_args.py (its check: no_buffer
    # and the Triton linear-attn decode backend) and in 0.5.23's arg groups
    Change("has_linear_replayssm", "0.5.15", True, "server_args.py enable_linear_replayssm"),
    # 0.5.17's server_args.py `enable_linear_replayssm_spec` (its checks: topk ≤ 1, triton/flashinfer decode,
    # not with --enable-linear-replayssm); from 0.5.20 a field of arg_groups/fields/exec_.py
    Change("has_linear_replayssm_spec", "0.5.17", True, "server_args.py enable_linear_replayssm_spec"),
    # cuda_graph_setup.py `should_skip_auto_prefill_cuda_graph_for_memory` (_MIN_AUTO_PREFILL_CUDA_GRAPH_FREE_
    # MEMORY_GB = 4.0) in 0.5.16 and 0.5.17; 0.5.18's capture_prefill_graph has no memory gate
    Change("auto_prefill_graph_gate", "0.5.16", True, "cuda_graph_setup.py auto prefill graph memory gate"),
    Change("auto_prefill_graph_gate", "0.5.18", False, "cuda_graph_setup.py capture_prefill_graph (no gate)"),
    # 0.5.17 environ.py `SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`, read by unified_radix_cache.py (the lock skip)
    # and kv_cache_configurator.py `_calculate_mamba_ratio` (base 3 − 1 under it; no_buffer adds it back)
    Change("has_skip_decode_lock", "0.5.17", True, "environ.py SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"),
)


def rules_for(version: str) -> SGLangRules:
    """The rule set of one release read, named after it (`sglang-0.5.15`): every feature's latest value at or
    before it."""
    key = release(version)
    changes = sorted((c for c in TIMELINE if release(c.first) <= key), key=lambda c: release(c.first))
    values: dict[str, Any] = {c.feature: c.value for c in changes}
    return SGLangRules(name=f"sglang-{version}", min_version=key, max_version=key, **values)


RULE_SETS: tuple[SGLangRules, ...] = tuple(rules_for(r) for r in RELEASES)
