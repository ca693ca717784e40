"""vLLM's GPU-memory arithmetic (pure), read from vLLM 0.24.0's source, checked against its logs on an H200.

KV memory (`v1/worker/gpu_worker.py::Worker.determine_available_memory`): total × util − weights − the
profiled peak (the larger of the forward pass over `max_num_batched_tokens` and the sampler's dummy run over
`max_num_seqs` rows of vocabulary logits) − the CUDA-graph estimate.

The hybrid allocator (`v1/core/kv_cache_utils.py`, `platforms/interface.py`): GDN state lives in the same
paged pool as attention KV. The attention block size is raised (in steps of the kernel alignment, 16) until
one attention page holds one Mamba state (conv window of `kernel − 1 + num_spec` tokens + fp32 SSM state);
the Mamba page is padded to equal it. Layers are grouped by type into groups of equal size (the smallest
type's count, or the largest when it is < 1.5× the smallest), padding the last group. The MTP drafter's layer
is one more full-attention layer. One block = page × group size; a request needs ⌈len/block⌉ blocks in each
attention group and 1 + num_spec blocks in each Mamba group (2 + num_spec in `align` mode). vLLM logs
"GPU KV cache size: N tokens" = max concurrency × max_model_len.

vLLM's CPU build (vLLM 0.32.0+cpu's `platforms/cpu.py`, `v1/worker/cpu_worker.py`): the KV space is
`VLLM_CPU_KVCACHE_SPACE` GiB of host RAM, exactly (no utilization, no profiling); blocks are 128 tokens unless
`--block-size` says otherwise, and max-num-seqs defaults to 128 per worker. It logs "CPU KV cache size".

`VLLMExtras` carries its own figures: gpu-memory-utilization (or the CPU KV space), blocks, concurrency.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleetgen.engines.vllm import vllm_rules
from fleetgen.modelcard import DTYPE_BYTES, ModelShape
from fleetgen.plan.types import GIB, Ask, Fix, Issue, Memory, MemoryExtras, Sizing

ACTIVATION_BYTES_PER_TOKEN = 512 * 1024  # forward-pass peak per batched token (estimate, not profiled here)
GRAPH_BYTES = 1 * GIB  # CUDA-graph estimate (vLLM 0.24 logged 0.96 GiB, 1.30 GiB with MTP-3 on a 27B model)
# What vLLM's start does not hold inside `--gpu-memory-utilization` × total, so what the fraction must leave:
# its own CUDA context, taken before it checks the free memory against the request (`gpu_worker.py`:
# "Free memory on device … on startup is less than desired GPU memory utilization"), and the CUDA graph
# pool past its profiled estimate ("CUDA graph pool memory: 1.14 GiB (actual), 0.96 GiB (estimated),
# difference: 0.18 GiB (15.6%)": vLLM 0.24 on the H200, tests/data/real-engines/vllm-0.24.0-h200), doubled.
VLLM_CONTEXT_BYTES = 512 * 1024 * 1024
UNPROFILED_GRAPH_SHARE = 0.32
# FlashAttention's kernel block sizes are MultipleOf(16); cache block_size defaults to 16
KERNEL_BLOCK_ALIGN = 16
# `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`: GPUs of >= 70 GiB (not A100) get 1024 / 8192
BIG_GPU_BYTES = 70 * GIB
DEFAULT_MAX_NUM_SEQS = {True: 1024, False: 256}
DEFAULT_BATCHED_TOKENS = {True: 8192, False: 2048}
# vLLM's CPU build: the env var that sets its KV space (integer GiB; unset, empty or 0: vLLM sizes it from
# the host's free RAM at start, which no plan can know), its default block size and max-num-seqs per worker
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_BLOCK_SIZE = 128
CPU_MAX_NUM_SEQS = 128
# The sampler's dummy run (`GPUModelRunner._dummy_sampler_run`) over R = max_num_seqs rows of V logits keeps,
# at its peak, per logit: the bf16 logits (2 B), their fp32 copy (4), the sort's fp32 values (4) and int64
# indices (8) of the PyTorch top-k/top-p path. With speculative decoding it then runs the rejection sampler on
# 2R rows of random bf16 logits (4 B per row-of-R logit), copies bonus and target rows (2 + 2), softmaxes the
# target rows in fp32 (4) and samples the bonus rows again (18): 30 B per logit of R rows.
SAMPLER_BYTES_PER_LOGIT = 18
REJECTION_SAMPLER_BYTES_PER_LOGIT = 30

FREE_LESS_THAN_UTIL = (
    "Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is less than desired GPU memory "
    "utilization ({util}, {req:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)
ONE_REQUEST = (
    "To serve at least one request with the model's max seq len ({ctx}), ({need:.2f} GiB KV cache is needed, "
    "which is larger than the available KV cache memory ({avail:.2f} GiB)."
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_spec_tokens(args: Mapping[str, Any]) -> int:
    """`num_speculative_tokens` of `--speculative-config` (0 without speculative decoding)."""
    raw = args.get("speculative-config")
    if not raw:
        return 0
    try:
        conf = json.loads(str(raw))
    except json.JSONDecodeError:
        return 0
    return int(conf.get("num_speculative_tokens", 0)) if isinstance(conf, Mapping) else 0


@dataclass(frozen=True)
class VLLMExtras(MemoryExtras):
    """vLLM's own figures beside the common ones: its utilization of total memory and its paged pool (blocks
    of `block_size` tokens per attention page)."""

    gpu_memory_utilization: float = 0.0
    block_size: int = 0
    num_blocks: int = 0
    cpu_kv_space_gib: int = 0  # vLLM's CPU build: its KV space (VLLM_CPU_KVCACHE_SPACE); 0 on a GPU
    # blocks / blocks per full-length request: what vLLM logs as "Maximum concurrency for N tokens per
    # request" (max-num-seqs does not cap it)
    max_concurrency: float = 0.0

    def budget_setting(self) -> str:
        if self.cpu_kv_space_gib:
            return f"{CPU_KV_SPACE_ENV}={self.cpu_kv_space_gib}"
        return f"gpu-memory-utilization {self.gpu_memory_utilization:.2f}"

    def capacity_rows(self) -> tuple[tuple[str, str], ...]:
        budget = (
            (CPU_KV_SPACE_ENV, f"{self.cpu_kv_space_gib} GiB of host RAM")
            if self.cpu_kv_space_gib
            else ("gpu-memory-utilization", f"{self.gpu_memory_utilization:.2f}")
        )
        return (
            budget,
            ("KV blocks (tokens each)", f"{self.num_blocks:,} ({self.block_size})"),
            ("max concurrency", f"{self.max_concurrency:,.2f}x"),
        )

    def planned(self) -> dict[str, float]:
        """vLLM reports its concurrency at max-model-len under `max_running_requests` (`Engine.capacity`):
        the planned figure beside it is the same one, not the max-num-seqs cap."""
        return {"max_running_requests": self.max_concurrency}

    def without_pools(self) -> VLLMExtras:
        return replace(self, num_blocks=0, max_concurrency=0.0)


@dataclass(frozen=True)
class Pool:
    """vLLM's paged pool layout: block size, page, layers per group, Mamba groups, and the blocks a request
    holds: `paged_groups` blocks for each `block_size` tokens of its KV, `fixed_blocks` whatever its length
    (its Mamba states), `blocks_per_request` at the context planned."""

    block_size: int
    page_bytes: int
    group_size: int
    mamba_groups: int
    paged_groups: int
    fixed_blocks: int
    blocks_per_request: int

    @property
    def bytes_per_block(self) -> int:
        return self.page_bytes * self.group_size


def pool_layout(
    shape: ModelShape, args: Mapping[str, Any], tp: int, ctx: int, default_block: int = KERNEL_BLOCK_ALIGN
) -> Pool:
    """Block size, page size and groups of the hybrid allocator for this model and these flags
    (`default_block`: the platform's block size where `--block-size` is not given)."""
    num_spec = num_spec_tokens(args)
    kv_dtype = str(args.get("kv-cache-dtype") or "auto")
    kv_bytes = shape.dtype_bytes if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, 1)
    heads = max(1, shape.num_kv_heads // tp)
    attn_token = 2 * heads * shape.head_dim * kv_bytes  # one token, one layer (K + V)
    ssm = str(args.get("mamba-ssm-cache-dtype") or "auto")
    ssm = shape.ssm_dtype if ssm == "auto" else ssm
    conv = str(args.get("mamba-cache-dtype") or "auto")
    conv_bytes = shape.dtype_bytes if conv == "auto" else DTYPE_BYTES.get(conv, 2)
    # `MambaStateShapeCalculator.gated_delta_net_state_shape`: the conv window holds the spec tokens too
    mamba_page = shape.gdn_state_bytes(
        tp, shape.linear_num_key_heads, shape.conv_kernel - 1 + num_spec, conv_bytes, ssm
    )
    block = max(int(args.get("block-size") or default_block), KERNEL_BLOCK_ALIGN)
    if mamba_page:
        block = max(block, KERNEL_BLOCK_ALIGN * _cdiv(mamba_page, KERNEL_BLOCK_ALIGN * attn_token))
    num_attn = len(shape.full_attention_layer_ids) + (shape.mtp_layers if num_spec else 0)
    counts = [n for n in (num_attn, len(shape.linear_layer_ids)) if n]
    group = min(counts)
    if max(counts) < group * 1.5:
        group = max(counts)
    attn_groups = _cdiv(num_attn, group)
    mamba_groups = _cdiv(len(shape.linear_layer_ids), group) if mamba_page else 0
    paged, fixed = _mamba_blocks(args, num_spec) if mamba_page else (0, 0)
    paged_groups, fixed_blocks = attn_groups + mamba_groups * paged, mamba_groups * fixed
    per_request = paged_groups * _cdiv(ctx, block) + fixed_blocks
    return Pool(block, block * attn_token, group, mamba_groups, paged_groups, fixed_blocks, per_request)


def _mamba_blocks(args: Mapping[str, Any], num_spec: int) -> tuple[int, int]:
    """Blocks one request holds in one Mamba group (`MambaSpec.max_memory_usage_bytes`) by cache mode, as
    (for each block of its tokens, whatever its length): `none` without prefix caching (vLLM's default for
    hybrid models), `align` when it is enabled, `all` a state at every block."""
    mode = str(args.get("mamba-cache-mode") or ("align" if args.get("enable-prefix-caching") else "none"))
    if mode == "all":
        return 1, num_spec
    return 0, (2 if mode == "align" else 1) + num_spec


def profiled_peak_bytes(shape: ModelShape, args: Mapping[str, Any], rows: int, *, is_big_gpu: bool) -> int:
    """The profile run's peak: the larger of the forward pass and the sampler's dummy run over `rows` (the
    max-num-seqs), + CUDA graphs."""
    batched = int(args.get("max-num-batched-tokens") or DEFAULT_BATCHED_TOKENS[is_big_gpu])
    per_logit = REJECTION_SAMPLER_BYTES_PER_LOGIT if num_spec_tokens(args) else SAMPLER_BYTES_PER_LOGIT
    sampler = rows * shape.vocab_size * per_logit
    graphs = 0 if args.get("enforce-eager") else GRAPH_BYTES
    return max(batched * ACTIVATION_BYTES_PER_TOKEN, sampler) + graphs


def cpu_kv_space_gib(env: Mapping[str, str]) -> int:
    """The KV space `VLLM_CPU_KVCACHE_SPACE` gives vLLM's CPU build (GiB); 0 when unset, empty, 0 or not an
    integer (vLLM's CUDA build ignores the variable: a fleet that sets it runs the CPU build)."""
    raw = str(env.get(CPU_KV_SPACE_ENV, "")).strip()
    return int(raw) if raw.isdigit() else 0


@dataclass(frozen=True)
class _Budget:
    """Where one platform puts the KV pool: its size, the memory around it, and the platform's defaults."""

    kv_pool: int
    requested: int  # the engine's static budget (weights + the pool)
    peak: int  # profiled activations + CUDA graphs, outside the pool (0 on CPU: not taken from the pool)
    seqs: int  # max-num-seqs
    block: int  # the default block size
    extras: VLLMExtras


def _gpu_budget(ask: Ask, weights: int) -> _Budget:
    """On a GPU: utilization × total, less the weights and the profiled peak."""
    util = float(
        ask.args.get("gpu-memory-utilization") or vllm_rules(ask.rules).default_gpu_memory_utilization
    )
    requested = int(ask.total_bytes * util)
    is_big = ask.total_bytes >= BIG_GPU_BYTES
    seqs = max_num_seqs(ask)
    peak = profiled_peak_bytes(ask.shape, ask.args, seqs, is_big_gpu=is_big)
    extras = VLLMExtras(gpu_memory_utilization=util)
    return _Budget(max(requested - weights - peak, 0), requested, peak, seqs, KERNEL_BLOCK_ALIGN, extras)


def _cpu_budget(ask: Ask, weights: int, space_gib: int) -> _Budget:
    """On vLLM's CPU build: the KV space is exactly `VLLM_CPU_KVCACHE_SPACE` GiB of host RAM."""
    seqs = max_num_seqs(ask)
    kv_pool = space_gib * GIB
    extras = VLLMExtras(cpu_kv_space_gib=space_gib)
    return _Budget(kv_pool, weights + kv_pool, 0, seqs, CPU_BLOCK_SIZE, extras)


def size_instance(ask: Ask) -> Sizing:
    """vLLM's verdict on one instance: its per-GPU memory arithmetic (or its CPU build's KV space) and the
    start-up errors vLLM would raise, with the caveat that vLLM profiles what is estimated here."""
    shape, args, tp = ask.shape, ask.args, ask.tp
    num_spec = num_spec_tokens(args)
    weights = shape.weight_bytes // tp if num_spec else (shape.weight_bytes - shape.mtp_weight_bytes) // tp
    space_gib = cpu_kv_space_gib(ask.env)
    budget = _cpu_budget(ask, weights, space_gib) if space_gib else _gpu_budget(ask, weights)
    ctx = int(args.get("max-model-len") or shape.context_length)
    pool = pool_layout(shape, args, tp, ctx, budget.block)
    num_blocks = budget.kv_pool // pool.bytes_per_block if pool.bytes_per_block else 0
    concurrency = num_blocks / pool.blocks_per_request if pool.blocks_per_request else 0.0
    cell = pool.page_bytes // pool.block_size * len(shape.full_attention_layer_ids)
    memory = Memory(
        free_bytes=ask.free_bytes,
        budget_bytes=budget.requested,
        headroom_bytes=ask.total_bytes - budget.requested,
        headroom_needed_bytes=budget.peak,
        weights_bytes=weights,
        rest_bytes=budget.kv_pool,
        kv_pool_bytes=num_blocks * pool.bytes_per_block,
        kv_bytes_per_token=cell,
        kv_tokens=int(concurrency * ctx),
        state_bytes_per_request=pool.mamba_groups * pool.group_size * pool.page_bytes * (1 + num_spec),
        max_running_requests=min(budget.seqs, int(concurrency)),
        context_length=ctx,
        extras=replace(
            budget.extras, block_size=pool.block_size, num_blocks=num_blocks, max_concurrency=concurrency
        ),
    )
    per_request = pool.blocks_per_request * pool.bytes_per_block
    if space_gib:
        note = f"planned as vLLM's CPU build ({CPU_KV_SPACE_ENV}={space_gib}): the GPU's memory is not used"
        return Sizing(
            memory, tuple(_errors(memory, ask.total_bytes, per_request, cpu=True)), (Issue("cpu", note),)
        )
    estimate = "vLLM activation and CUDA-graph memory are estimates; vLLM profiles them at start"
    warnings = (Issue("estimate", f"{estimate} (log: 'Available KV cache memory')"),)
    resolved = {"gpu_memory_utilization": budget.extras.gpu_memory_utilization}
    return Sizing(memory, tuple(_errors(memory, ask.total_bytes, per_request)), warnings, resolved)


def _errors(m: Memory, total_bytes: int, per_request: int, *, cpu: bool = False) -> list[Issue]:
    """vLLM's start-up refusals in its words: free GPU memory short of the request (not on CPU), or no room
    for one request."""
    requested = m.budget_bytes
    if not cpu and m.free_bytes < requested:
        text = FREE_LESS_THAN_UTIL.format(
            free=m.free_bytes / GIB,
            total=total_bytes / GIB,
            util=VLLMExtras.of(m).gpu_memory_utilization,
            req=requested / GIB,
        )
        return [Issue("gpu-memory-utilization", text, "lower gpu-memory-utilization or free the GPU")]
    if m.rest_bytes < per_request:
        text = ONE_REQUEST.format(ctx=m.context_length, need=per_request / GIB, avail=m.rest_bytes / GIB)
        more = f"raise {CPU_KV_SPACE_ENV}" if cpu else "raise gpu-memory-utilization"
        return [Issue("kv-cache", text, f"{more}, lower max-model-len or use tp = 2")]
    return []


def largest_safe_utilization(ask: Ask) -> float:
    """The largest `--gpu-memory-utilization` (in hundredths) vLLM starts with and runs under on this GPU:
    the request within the free memory its own CUDA context leaves, with room outside it for the graph pool
    past its estimate; 0.0 where none. vLLM profiles activations and graphs inside the request, so a higher
    fraction grows the KV pool and risks only what is outside it."""
    graphs = 0 if ask.args.get("enforce-eager") else int(GRAPH_BYTES * UNPROFILED_GRAPH_SHARE)
    usable = min(ask.free_bytes - VLLM_CONTEXT_BYTES, ask.total_bytes - graphs)
    if ask.total_bytes <= 0 or usable <= 0:
        return 0.0
    return min(100 * usable // ask.total_bytes, 99) / 100


def variants(ask: Ask) -> list[Fix]:
    """vLLM's own way out: a higher utilization (on its CPU build: twice the KV space)."""
    if space_gib := cpu_kv_space_gib(ask.env):
        return [Fix(1, f"{CPU_KV_SPACE_ENV}={2 * space_gib}", env={CPU_KV_SPACE_ENV: str(2 * space_gib)})]
    return [Fix(1, "--gpu-memory-utilization 0.95", {"gpu-memory-utilization": 0.95})]


def concurrency(ask: Ask, sized: Sizing, n: int) -> dict[str, Any]:
    """max-num-seqs: vLLM sizes its one paged pool itself."""
    return {"max-num-seqs": n}


def max_num_seqs(ask: Ask) -> int:
    """`--max-num-seqs`, or vLLM's default: per CPU worker on its CPU build, else by the GPU's size."""
    if cpu_kv_space_gib(ask.env):
        return int(ask.args.get("max-num-seqs") or CPU_MAX_NUM_SEQS * ask.tp)
    return int(ask.args.get("max-num-seqs") or DEFAULT_MAX_NUM_SEQS[ask.total_bytes >= BIG_GPU_BYTES])
