"""SGLang's GPU-memory arithmetic, as the release named by the rule set does it (pure).

rest = free·mfs − weights, then the Mamba pool and spec scratch (`SGLangRules.mamba_pool_solve`), then KV.
≤0.5.12 (`model_runner_kv_cache_mixin.py`): the spec scratch P·MRR·D is taken first (uncapped MRR), then the
Mamba pool by ratio (M = rest·r/(1+r) // P); the MTP draft's weights and KV live outside the budget.
0.5.13: Mamba pool and scratch solved jointly; 0.5.14: draft weights and the MTP layer's KV inside the
budget; 0.5.17 (`kv_cache_configurator.py`): the joint solve counts the pool's padding slot.
An MTP head without a draft path keeps its own KV pool out of the headroom in 0.5.14–0.5.15, and it allocates
its own embedding and LM head at load (`Qwen3_5ForCausalLMMTP.__init__`; shared with the target only later,
by `set_embed_and_head`), so its load counts vocab × hidden twice more: "mem usage=5.53 GB" on Qwen3.6-27B.

`SGLangExtras`: mem fraction, draft weights, Mamba pool, spec scratch, hicache host RAM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fleetgen.engines.sglang import (
    MAMBA_TOO_SMALL,
    NOT_ENOUGH_MEMORY,
    WEIGHTS_LEAVE_NOTHING,
    MaxRunningCap,
    SGLangRules,
)
from fleetgen.modelcard import ModelShape
from fleetgen.plan.sglang.headroom import headroom_needed
from fleetgen.plan.sglang.settings import SGLangAsk, SGLangSettings
from fleetgen.plan.types import GIB, MIB, Issue, Memory, MemoryExtras

CONV_DTYPE_BYTES = 2  # SGLANG_MAMBA_CONV_DTYPE defaults to bfloat16
HICACHE_RESERVE_BYTES = 10 * GIB  # SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES
# What an SGLang scheduler holds on its GPU before it measures `pre_model_load_memory`, the free memory its
# whole budget is a fraction of (CUDA context, kernels loaded at import, torch.distributed): measured. On the
# H200 (143,771 MiB, 0 used) every 0.5.15 start logged "Load weight begin. avail mem=139.09 GB": 1,343 MiB
# (tests/data/real-engines/sglang-0.5.15-h200-tune/). With the 512 MiB assumed before and no load overhead
# (below), the plan gave the pools ~1.1 GB SGLang never had: 14 % of MTP's KV pool at 75 running.
CUDA_CONTEXT_BYTES = 1343 * MIB
# ... and on the H100 80GB (81,559 MiB) every 0.5.15 start logged 78.47 GB: 1,206 MiB
# (bench/results/raw/tune-sglang-0.5.15-h100-steady/). Between the two cards the context grows with the card's
# memory (CUDA's own tables): a line through both measurements (`cuda_context_bytes`).
CONTEXT_PER_CARD_BYTE = (1343 - 1206) / (143_771 - 81_559)
CONTEXT_CARD = 143_771 * MIB  # the card CUDA_CONTEXT_BYTES was measured on
# What loading the target takes beyond its checkpoint's tensors, per GPU: buffers built on the GPU at init and
# kept in PyTorch's cache (the RoPE cos/sin cache over max_position and its temporaries, …), which SGLang's
# free-memory measure counts as used. Measured: Qwen3.6-27B logged "mem usage=51.31 GB" for 50.96 GiB of
# tensors (index total_size less the mtp.* layer), in every 0.5.15 start on the H200; the MTP draft's load
# matched its tensors (5.53 GB).
LOAD_OVERHEAD_BYTES = 364 * MIB
# 0.5.17+: the tokenizer process's own CUDA context, beside the CUDA-IPC multimodal feature pool it allocates
# on the base GPU before the scheduler measures its free memory. Measured: on one H100 80GB every 0.5.17 start
# logged "Load weight begin. avail mem=76.96 GB" against 0.5.15's 78.47 on the same kind of card: 1,547 MiB,
# 1,024 of them the pool it logged (tests/data/real-engines/sglang-0.5.17-h100-tune/).
TOKENIZER_CONTEXT_BYTES = 523 * MIB


def cuda_context_bytes(total_bytes: int) -> int:
    """What a scheduler holds before it measures its free memory, on a card of `total_bytes`."""
    return max(int(CUDA_CONTEXT_BYTES + (total_bytes - CONTEXT_CARD) * CONTEXT_PER_CARD_BYTE), 0)


@dataclass(frozen=True)
class SGLangExtras(MemoryExtras):
    """SGLang's own figures beside the common ones: its static fraction, the MTP draft's weights, the Mamba
    pool (slots, ρ slots per running request, bytes), the speculative scratch and the hierarchical cache's
    pinned host RAM."""

    mem_fraction_static: float = 0.0
    draft_weights_bytes: int = 0
    mamba_slots: int = 0
    mamba_ratio: int = 0
    mamba_pool_bytes: int = 0
    spec_scratch_bytes: int = 0
    hicache_host_bytes: int = 0
    headroom: str = ""  # what the engine needs outside the pools, in parts (`plan.sglang.headroom`)

    def budget_setting(self) -> str:
        return f"mem-fraction-static {self.mem_fraction_static:.3f}"

    def memory_rows(self) -> tuple[tuple[str, int], ...]:
        return (
            ("Mamba pool", self.mamba_pool_bytes),
            ("spec scratch", self.spec_scratch_bytes),
            ("hicache host RAM", self.hicache_host_bytes),
        )

    def capacity_rows(self) -> tuple[tuple[str, str], ...]:
        return (
            ("mem-fraction-static", f"{self.mem_fraction_static:.3f}"),
            ("Mamba slots (ρ per request)", f"{self.mamba_slots} ({self.mamba_ratio})"),
        )

    def planned(self) -> dict[str, float]:
        return {"mamba_slots": float(self.mamba_slots)}

    def without_pools(self) -> SGLangExtras:
        return replace(self, mamba_slots=0, mamba_pool_bytes=0, spec_scratch_bytes=0)


def state_bytes_per_request(shape: ModelShape, tp: int, ssm_dtype: str) -> int:
    """Conv + SSM state of one request, all linear layers (`BaseLinearStateParams.mamba_cache_per_req`)."""
    groups = shape.linear_num_key_heads
    groups = tp if groups % tp else groups  # `extra_groups_for_head_shards`: replicated to cover the shards
    per_layer = shape.gdn_state_bytes(tp, groups, shape.conv_kernel - 1, CONV_DTYPE_BYTES, ssm_dtype)
    return per_layer * len(shape.linear_layer_ids)


def spec_ring_bytes(shape: ModelShape, tp: int, draft_tokens: int) -> int:
    """`--enable-linear-replayssm-spec`'s fold window per Mamba slot, all linear layers: raw v and k in the
    conv dtype, beta and the gate in fp32, each `draft_tokens` long (0.5.17 `replayssm_ring_bytes_per_req`,
    configs/mamba_utils.py; the solve charges it per slot in place of the intermediate SSM snapshots)."""
    hk, hv = shape.linear_num_key_heads // tp or 1, shape.linear_num_value_heads // tp or 1
    per_token = (hv * shape.linear_value_head_dim + hk * shape.linear_key_head_dim) * CONV_DTYPE_BYTES
    per_token += 2 * hv * 4
    return per_token * draft_tokens * len(shape.linear_layer_ids)


def kv_bytes_per_token(shape: ModelShape, tp: int, kv_dtype_bytes: int, *, draft_layers: int = 0) -> int:
    """K+V bytes per token on one GPU over the full-attention layers; KV heads replicated when tp > heads."""
    heads = max(1, shape.num_kv_heads // tp)
    num_layers = len(shape.full_attention_layer_ids)
    cell = heads * (shape.head_dim + shape.v_head_dim) * num_layers * kv_dtype_bytes
    if draft_layers and num_layers:  # `DefaultPoolConfigurator`: EAGLE/MTP draft KV in the cell
        cell += int(cell * draft_layers / num_layers)
    return cell


def draft_weight_bytes(shape: ModelShape, tp: int) -> int:
    """What loading the MTP draft takes on one GPU: its layers + its own embedding and LM head (tied: one)."""
    if not shape.mtp_layers:
        return 0
    vocab_tables = 1 if shape.tie_word_embeddings else 2
    return (
        shape.mtp_weight_bytes + vocab_tables * shape.vocab_size * shape.hidden_size * shape.dtype_bytes
    ) // tp


def draft_kv_in_cell(s: SGLangSettings, rules: SGLangRules) -> bool:
    """Whether the draft's KV is folded into the target's per-token cell (inside the budget)."""
    return s.is_spec and rules.draft_kv_in_budget and (s.has_draft_path or rules.pathless_draft_kv_in_budget)


def gpu_tier(total_mib: float, tp: int, rules: SGLangRules) -> tuple[int, int]:
    """(chunked_prefill_size, cuda-graph max bs) SGLang picks by GPU size (`handle_gpu_memory_settings`)."""
    if total_mib < 20 * 1024:
        return 2048, 8
    if total_mib < 35 * 1024:
        chunk, small_tp, big_tp = rules.gpu_tier_35g
        return chunk, small_tp if tp < 4 else big_tp
    if total_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if total_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def reserved_mib(total_bytes: int, tp: int, s: SGLangSettings, rules: SGLangRules) -> float:
    """SGLang's activation + CUDA-graph reserve (MiB) behind the default --mem-fraction-static."""
    total_mib = total_bytes / MIB
    chunk, max_bs = gpu_tier(total_mib, tp, rules)
    chunk = s.chunked_prefill_size or chunk
    max_bs = s.cuda_graph_max_bs or max_bs
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + max_bs * 2
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if s.is_spec:
        reserved += rules.spec_reserve_mb
    return reserved


def default_mem_fraction(
    total_bytes: int, tp: int, s: SGLangSettings, rules: SGLangRules, shape: ModelShape
) -> float:
    """The --mem-fraction-static SGLang picks when none is given (incl. `adjust_mem_fraction_for_vlm`)."""
    total_mib = total_bytes / MIB
    mfs = round((total_mib - reserved_mib(total_bytes, tp, s, rules)) / total_mib, 3)
    if shape.is_multimodal:
        layers = shape.vision_num_layers or 24
        hidden = shape.vision_hidden_size or 1024
        ratio = layers * hidden**2 / (24 * 1024**2)
        mfs *= 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return mfs


@dataclass(frozen=True)
class _Pool:
    slots: int
    scratch: int
    rest_after: float


def _mamba_pool(rest: float, p: int, s: SGLangSettings, rules: SGLangRules) -> _Pool:
    """Mamba slots and spec scratch out of `rest` bytes (`handle_max_mamba_cache` of the release)."""
    solve = rules.mamba_pool_solve
    if solve.startswith("joint"):
        return _joint_pool(rest, p, s, _padding(rules))
    d, mrr = s.draft_tokens, s.max_running_requests or 0
    scratch = p * mrr * d if s.is_spec else 0
    if solve != "ratio-scratch":  # 0.5.8+: the scratch is reserved first, in every branch
        rest -= scratch
    fixed = s.max_mamba_cache_size
    if solve in ("ratio-scratch", "scratch-first-512") and (fixed is not None or not s.is_radix):
        m = fixed if fixed is not None else (s.max_running_requests or 512)  # ≤0.5.8: 512 slots by default
        return _Pool(m, scratch if solve != "ratio-scratch" else 0, rest - m * p)
    if solve == "ratio-scratch":
        rest -= scratch  # 0.5.7 reserves the scratch only on the ratio path
    if fixed is not None:
        m = fixed
    elif not s.is_radix and s.max_running_requests is not None:
        m = s.max_running_requests
    else:
        m = int(rest * s.mamba_full_memory_ratio / (1 + s.mamba_full_memory_ratio) // p)
    return _Pool(m, scratch, rest - m * p)


def _joint_pool(rest: float, p: int, s: SGLangSettings, pad: int) -> _Pool:
    """0.5.13+: Mamba pool and spec scratch solved jointly; `pad` (1 from 0.5.17) counts the padding slot."""
    d, rho, mrr = s.draft_tokens, s.mamba_ratio, s.max_running_requests or 0
    budget = rest * s.mamba_full_memory_ratio / (1 + s.mamba_full_memory_ratio)
    if s.max_mamba_cache_size is not None:
        m = s.max_mamba_cache_size
    elif not s.is_radix and s.max_running_requests is not None:
        m = max(1, s.max_running_requests)
    elif s.is_spec:
        m = int((budget - pad * p * (1 + d)) // (p * (1 + d / rho)))
    else:
        m = int((budget - pad * p) // p)
    capped = m if not s.is_radix and s.max_mamba_cache_size is None else min(max(1, mrr), m // rho)
    scratch = p * (capped + pad) * d if s.is_spec else 0
    return _Pool(m, scratch, rest - scratch - (m + pad) * p)


def max_running(tokens: int, s: SGLangSettings, rules: SGLangRules, slots: int | None) -> int:
    """`resolve_max_num_reqs`: the estimate, the user's cap, token and Mamba-slot limits."""
    estimated = max(min(int(tokens / max(s.context_length, 1) * 512), 4096), 2048)
    if s.max_running_requests is not None:
        caps: dict[MaxRunningCap, int] = {
            "none": s.max_running_requests,
            "estimate": estimated,
            "half-tokens": tokens // 2,
        }
        n = min(s.max_running_requests, caps[rules.mrr_cap])
    else:
        n = min(estimated, tokens // 2)
    if slots is not None:
        n = min(n, slots // s.mamba_ratio)
    return max(n, 0)


def size_sglang(x: SGLangAsk) -> tuple[Memory, list[Issue]]:
    """The whole per-GPU plan of one SGLang instance, and the memory errors the engine would raise."""
    shape, rules, tp, total_bytes, s = x.shape, x.rules, x.tp, x.total_bytes, x.settings
    mfs = s.mem_fraction_static or default_mem_fraction(total_bytes, tp, s, rules, shape)
    free = max(x.free_bytes - cuda_context_bytes(x.total_bytes) - held_by_tokenizer(s), 0)
    draft_w, weights, rest = _rest(x, free * mfs)
    p = state_bytes_per_request(shape, tp, s.ssm_dtype)
    solve = s
    if s.is_linear_replayssm_spec:  # 0.5.17: sized like no speculation, each slot with its fold window
        p += spec_ring_bytes(shape, tp, s.draft_tokens)
        solve = replace(s, is_spec=False)
    pool = _mamba_pool(rest, p, solve, rules) if shape.is_hybrid else _Pool(0, 0, rest)
    draft_layers = shape.mtp_layers if draft_kv_in_cell(s, rules) else 0
    cell = kv_bytes_per_token(shape, tp, s.kv_dtype_bytes, draft_layers=draft_layers)
    tokens = max(int(pool.rest_after) // cell // s.page_size * s.page_size, 0) if cell else 0
    if s.max_total_tokens is not None:
        tokens = min(tokens, s.max_total_tokens)
    running = max_running(tokens, s, rules, pool.slots if shape.is_hybrid else None)
    tier_chunk, tier_bs = gpu_tier(total_bytes / MIB, tp, rules)
    needed = headroom_needed(
        shape,
        tp,
        chunk=s.chunked_prefill_size or tier_chunk,
        graph_bs=s.cuda_graph_max_bs or tier_bs,
        running=running,
        slots=pool.slots,
        is_replay=s.is_linear_replayssm,
    )
    extras = SGLangExtras(
        mem_fraction_static=mfs,
        draft_weights_bytes=draft_w,
        mamba_slots=pool.slots,
        mamba_ratio=s.mamba_ratio if shape.is_hybrid else 0,
        mamba_pool_bytes=(pool.slots + _padding(rules)) * p if shape.is_hybrid else 0,
        spec_scratch_bytes=int(pool.scratch),
        headroom=needed.text(),
    )
    memory = Memory(
        free_bytes=free,
        budget_bytes=int(free * mfs),
        weights_bytes=weights,
        rest_bytes=int(rest),
        kv_bytes_per_token=cell,
        state_bytes_per_request=p,
        kv_pool_bytes=tokens * cell,
        kv_tokens=tokens,
        max_running_requests=running if tokens > 0 else 0,
        headroom_bytes=int(free * (1 - mfs)),
        headroom_needed_bytes=needed.total + _outside_budget(x, tokens, cell),
        context_length=s.context_length,
        extras=extras,
    )
    return memory, memory_errors(memory, shape, rules)


def held_by_tokenizer(s: SGLangSettings) -> int:
    """What the tokenizer's processes hold on the base GPU before the scheduler measures its free memory:
    the CUDA-IPC multimodal feature pool (0.5.17+, `SGLangSettings.mm_ipc_pool_mb`), a CUDA context each."""
    if not s.mm_ipc_pool_mb:
        return 0
    return s.mm_ipc_pool_mb * MIB + s.tokenizer_workers * TOKENIZER_CONTEXT_BYTES


def _rest(x: SGLangAsk, budget: float) -> tuple[int, int, float]:
    """(draft weights, weights counted in the budget, what the budget leaves for the pools). The target's
    weights are what its load takes (`LOAD_OVERHEAD_BYTES` over its tensors), as SGLang's "mem usage" says."""
    shape, rules, tp = x.shape, x.rules, x.tp
    draft_w = draft_weight_bytes(shape, tp) if x.settings.is_spec else 0
    in_budget = draft_w if rules.draft_weights_in_budget else 0
    weights = (shape.weight_bytes - shape.mtp_weight_bytes) // tp + LOAD_OVERHEAD_BYTES + in_budget
    rest = budget - weights
    if shape.is_multimodal:
        rest -= rules.vlm_cache_reserve_mb * MIB  # 0.5.18+ reserves the VLM embedding cache out of KV
    return draft_w, weights, rest


def _outside_budget(x: SGLangAsk, tokens: int, cell: int) -> int:
    """Early 2026: the MTP draft's weights and its own KV pool come out of the (1 - mfs) headroom."""
    s = x.settings
    if not s.is_spec:
        return 0
    shape, rules, tp = x.shape, x.rules, x.tp
    outside = 0 if rules.draft_weights_in_budget else draft_weight_bytes(shape, tp)
    if not draft_kv_in_cell(s, rules):
        with_draft = kv_bytes_per_token(shape, tp, s.kv_dtype_bytes, draft_layers=shape.mtp_layers)
        outside += tokens * (with_draft - cell)
    return outside


def _padding(rules: SGLangRules) -> int:
    return int(rules.mamba_pool_solve == "joint-padded")


def _unchecked(text: str, rules: SGLangRules) -> str:
    """Before 0.5.13 SGLang had no explicit Mamba-pool check: say what happens and what later releases say."""
    if rules.mamba_oom_errors:
        return text
    return (
        f"{rules.name} does not check this and fails later (tensor allocation or an empty scheduler); "
        f"releases from 0.5.13 say: {text}"
    )


def memory_errors(m: Memory, shape: ModelShape, rules: SGLangRules) -> list[Issue]:
    """What SGLang would raise at start for these numbers, in its own words."""
    sg = SGLangExtras.of(m)
    if shape.is_hybrid and sg.mamba_slots <= 0:
        text = MAMBA_TOO_SMALL.format(size=sg.mamba_slots)
        return [Issue("mamba-pool", _unchecked(text, rules), MEMORY_FIX)]
    if m.rest_bytes <= 0 and rules.draft_weights_in_budget:
        return [Issue("weights", WEIGHTS_LEAVE_NOTHING.format(mfs=sg.mem_fraction_static), MEMORY_FIX)]
    if m.kv_tokens <= 0:
        return [Issue("kv-cache", NOT_ENOUGH_MEMORY.format(mfs=sg.mem_fraction_static), MEMORY_FIX)]
    if shape.is_hybrid and m.max_running_requests <= 0:
        text = (
            f"Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            f"max_mamba_cache_size={sg.mamba_slots}, mamba_ratio={sg.mamba_ratio}"
        )
        return [Issue("mamba-pool", _unchecked(text, rules), MEMORY_FIX)]
    return []


MEMORY_FIX = "see the ranked fixes (max-mamba-cache-size, mamba-ssm-dtype bfloat16, tp = 2, shorter context)"
