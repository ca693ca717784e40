"""SGLang launch settings as the engine resolves them from argv + env, per rule set (pure).

Defaults are SGLang's own: speculative decoding defaults to steps/topk/draft = 3/1/4 and 48 running requests;
with topk 1 the draft tokens are forced to steps + 1; `auto` Mamba strategy resolves per release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgen.engines import Translation, translate_args
from fleetgen.engines.sglang import MambaRatioRule, SGLangRules, sglang_rules
from fleetgen.modelcard import DTYPE_BYTES, ModelShape
from fleetgen.plan.types import Ask

TRUE_ENV = {"1", "true", "yes", "on"}
SKIP_DECODE_LOCK_ENV = "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"  # environ.py (0.5.17+): EnvBool(False)
ENV_BOOL_TRUE = {"true", "1", "yes", "y"}  # environ.py `EnvBool.parse` (0.5.17)
SPEC_DEFAULT_STEPS, SPEC_DEFAULT_TOPK, SPEC_DEFAULT_DRAFT = 3, 1, 4
MM_POOL_ENV = "SGLANG_MM_FEATURE_CACHE_MB"  # environ.py (0.5.17+): the CUDA-IPC pool's budget, MiB
LEGACY_IPC_ENV = "SGLANG_USE_CUDA_IPC_TRANSPORT"  # read where --mm-feature-transport is not given


@dataclass(frozen=True)
class SGLangSettings:
    """The flags that decide SGLang's memory plan, after the engine's own defaulting."""

    mem_fraction_static: float | None
    is_spec: bool
    draft_tokens: int
    strategy: str
    strategy_given: str
    is_radix: bool
    is_overlap: bool
    max_running_requests: int | None
    max_mamba_cache_size: int | None
    mamba_full_memory_ratio: float
    ssm_dtype: str
    kv_dtype_bytes: int
    context_length: int
    page_size: int
    chunked_prefill_size: int | None
    max_total_tokens: int | None
    track_interval: int
    is_hicache: bool
    hicache_ratio: float
    hicache_size_gb: int
    cuda_graph_max_bs: int | None
    ratio_rule: MambaRatioRule = "by-overlap"
    has_draft_path: bool = False  # --speculative-draft-model-path given (an MTP head needs none)
    is_linear_replayssm: bool = False  # --enable-linear-replayssm: its ring buffers live outside the budget
    # --enable-linear-replayssm-spec (0.5.17+): no intermediate SSM snapshots, a fold window per slot instead
    is_linear_replayssm_spec: bool = False
    # SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1 where the release reads it (0.5.17+)
    is_skip_decode_lock: bool = False
    radix_dropped_for_spec: bool = False  # 0.5.9 turned radix cache off for spec + no_buffer
    # the tokenizer's CUDA-IPC multimodal feature pool (MiB, 0: none) and its processes (a CUDA context each)
    mm_ipc_pool_mb: int = 0
    tokenizer_workers: int = 1

    @property
    def mamba_ratio(self) -> int:
        """Mamba slots per running request: 1 | 3 | 4 | 5, as the release computes it.

        by-overlap (0.5.10+ `_calculate_mamba_ratio`): extra_buffer 5 with overlap, 4 without (lazy 4); under
        SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK (0.5.17+) one fewer for extra_buffer, no_buffer unchanged (its
        base drops by 1 and the drop is added back: kv_cache_configurator.py);
        by-spec (0.5.8–0.5.9 `init_memory_pool`): extra_buffer 4 with spec, 5 without; no_buffer 3;
        by-spec-quirk (0.5.7): as by-spec, but no_buffer also gets 5.
        """
        if not self.is_radix:
            return 1
        is_extra = self.strategy.startswith("extra_buffer")
        if self.ratio_rule == "by-overlap":
            skip = int(self.is_skip_decode_lock and is_extra)
            if self.strategy == "extra_buffer_lazy":
                return 4 - skip
            return ((5 if self.is_overlap else 4) if is_extra else 3) - skip
        if is_extra:
            return 4 if self.is_spec else 5
        return 5 if self.ratio_rule == "by-spec-quirk" else 3


def _int(args: Mapping[str, Any], key: str) -> int | None:
    value = args.get(key)
    return None if value is None or isinstance(value, bool) else int(value)


def _float(args: Mapping[str, Any], key: str) -> float | None:
    value = args.get(key)
    return None if value is None or isinstance(value, bool) else float(value)


def _spec(args: Mapping[str, Any]) -> tuple[bool, int]:
    """(is_spec, draft tokens) with SGLang's defaults; topk 1 forces draft = steps + 1."""
    algo = str(args.get("speculative-algorithm") or "")
    steps = _int(args, "speculative-num-steps") or SPEC_DEFAULT_STEPS
    topk = _int(args, "speculative-eagle-topk") or SPEC_DEFAULT_TOPK
    draft = _int(args, "speculative-num-draft-tokens") or SPEC_DEFAULT_DRAFT
    if topk == 1:
        draft = steps + 1  # SGLang overwrites it (with a warning) when topk == 1
    return bool(algo) and algo.lower() != "none", draft


@dataclass(frozen=True)
class _Strategy:
    given: str
    strategy: str
    is_radix: bool
    is_overlap: bool
    radix_dropped: bool = False


def _spec_overlap(env: Mapping[str, str], rules: SGLangRules) -> bool:
    """Whether the overlap (v2) spec worker runs: opt-in by env ≤0.5.10, default on 0.5.11–0.5.13, always."""
    if not rules.spec_v2_env:
        return True
    value = env.get(rules.spec_v2_env)
    return rules.spec_v2_default if value is None else value.lower() in TRUE_ENV


def _strategy(
    args: Mapping[str, Any], env: Mapping[str, str], rules: SGLangRules, shape: ModelShape, is_spec: bool
) -> _Strategy:
    """The Mamba strategy, radix cache and overlap as the release resolves `auto` and the spec worker."""
    is_radix = not args.get("disable-radix-cache")
    is_overlap = not args.get("disable-overlap-schedule")
    if is_spec:
        is_overlap = is_overlap and _spec_overlap(env, rules)
    given = str(args.get(rules.strategy_flag) or "auto")
    strategy = given
    if given == "auto":
        paging = (_int(args, "page-size") or 1) > 1
        is_extra = rules.auto_strategy_extra_buffer and (is_overlap or paging) and is_radix
        strategy = "extra_buffer" if is_extra else "no_buffer"
    if shape.is_hybrid and is_radix and strategy == "no_buffer":
        if is_spec and rules.spec_no_buffer_radix == "radix_off":
            return _Strategy(given, strategy, False, is_overlap, radix_dropped=True)
        # no_buffer turns overlap off, except an explicit no_buffer from 0.5.14 (which asserts instead)
        is_overlap = is_overlap and given != "auto" and rules.explicit_no_buffer_needs_no_overlap
    return _Strategy(given, strategy, is_radix, is_overlap)


def resolve_settings(
    args: Mapping[str, Any], env: Mapping[str, str], rules: SGLangRules, shape: ModelShape
) -> SGLangSettings:
    """Resolve `engine.args` (already translated to `rules`' flag names) the way that release does."""
    is_spec, draft = _spec(args)
    st = _strategy(args, env, rules, shape, is_spec)
    kv_dtype = str(args.get("kv-cache-dtype") or "auto")
    return SGLangSettings(
        mem_fraction_static=_float(args, "mem-fraction-static"),
        is_spec=is_spec,
        draft_tokens=draft if is_spec else 0,
        strategy=st.strategy,
        strategy_given=st.given,
        is_radix=st.is_radix,
        is_overlap=st.is_overlap,
        max_running_requests=_int(args, "max-running-requests")
        or (rules.default_spec_max_running if is_spec else None),
        max_mamba_cache_size=_int(args, "max-mamba-cache-size"),
        mamba_full_memory_ratio=_float(args, "mamba-full-memory-ratio") or 0.9,
        ssm_dtype=str(args.get("mamba-ssm-dtype") or shape.ssm_dtype),
        kv_dtype_bytes=shape.dtype_bytes if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, 1),
        context_length=_int(args, "context-length") or shape.context_length,
        page_size=_int(args, "page-size") or 1,
        chunked_prefill_size=_int(args, "chunked-prefill-size"),
        max_total_tokens=_int(args, "max-total-tokens"),
        track_interval=_int(args, "mamba-track-interval") or 256,
        is_hicache=bool(args.get("enable-hierarchical-cache")),
        hicache_ratio=_float(args, "hicache-ratio") or 2.0,
        hicache_size_gb=_int(args, "hicache-size") or 0,
        cuda_graph_max_bs=_int(args, "cuda-graph-max-bs") or _int(args, "cuda-graph-max-bs-decode"),
        ratio_rule=rules.mamba_ratio_rule,
        radix_dropped_for_spec=st.radix_dropped,
        has_draft_path=bool(args.get("speculative-draft-model-path")),
        is_linear_replayssm=bool(args.get("enable-linear-replayssm")),
        is_linear_replayssm_spec=rules.has_linear_replayssm_spec
        and is_spec
        and bool(args.get("enable-linear-replayssm-spec")),
        is_skip_decode_lock=rules.has_skip_decode_lock
        and env.get(SKIP_DECODE_LOCK_ENV, "").lower() in ENV_BOOL_TRUE,
        mm_ipc_pool_mb=_mm_ipc_pool_mb(args, env, rules, shape),
        tokenizer_workers=_int(args, "tokenizer-worker-num") or 1,
    )


def _mm_ipc_pool_mb(
    args: Mapping[str, Any], env: Mapping[str, str], rules: SGLangRules, shape: ModelShape
) -> int:
    """The CUDA-IPC multimodal feature pool the release's tokenizer reserves on the base GPU (MiB): a model
    with a multimodal processor whose transport resolves to cuda_ipc (given, or `auto` on one CUDA node, not
    encoder-only, not disaggregated, the legacy env not off)."""
    if not (rules.mm_ipc_pool_mb and shape.is_multimodal):
        return 0
    transport = args.get("mm-feature-transport")
    if transport is None and LEGACY_IPC_ENV in env:
        transport = "cuda_ipc" if env[LEGACY_IPC_ENV].lower() in ENV_BOOL_TRUE else "cpu"
    if transport is None:
        single = (_int(args, "nnodes") or 1) == 1 and str(args.get("disaggregation-mode") or "null") == "null"
        transport = "cuda_ipc" if single and not args.get("encoder-only") else "cpu"
    if transport != "cuda_ipc" or args.get("encoder-only"):
        return 0
    return int(env.get(MM_POOL_ENV) or rules.mm_ipc_pool_mb)


@dataclass(frozen=True)
class SGLangAsk(Ask):
    """An ask as SGLang sees it: its release's rules, its flags translated to that release's names and
    resolved as the release resolves them. What its memory arithmetic and its flag rules read."""

    rules: SGLangRules
    translation: Translation
    settings: SGLangSettings


def sglang_ask(ask: Ask) -> SGLangAsk:
    """`ask` with SGLang's view of it (`ask.rules` is one of SGLang's rule sets: `select_rule_set` picked it
    from the engine's own)."""
    rules = sglang_rules(ask.rules)
    translation = translate_args(ask.args, rules)
    settings = resolve_settings(translation.args, ask.env, rules, ask.shape)
    return SGLangAsk(**{**vars(ask), "rules": rules}, translation=translation, settings=settings)
