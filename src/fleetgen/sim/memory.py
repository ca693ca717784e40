"""Capacity arithmetic of the simulated startup, in the shape of SGLang 0.5.23's KV-cache configurator.

Simple, deterministic and explained, not a profiler: free memory at start = GPU memory − 0.6 GiB (context);
`rest = free·mem_fraction_static − weights`; hybrid archs carve the Mamba pool out of `rest` first
(`ratio/(1+ratio)` of it, jointly with the speculative scratch, as `_handle_max_mamba_cache` does); the rest
is KV at `kv_bytes_per_token`. The failures raise SGLang's own exception types and texts
(`mem_cache/kv_cache_configurator.py`, `model_executor/pool_configurator.py`).
"""

from __future__ import annotations

import dataclasses
import math

from fleetgen.sim.model import ModelShape

GIB = 1 << 30
CUDA_CONTEXT_GIB = 0.6
MAMBA_BASE_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO


@dataclasses.dataclass(frozen=True)
class MemoryInputs:
    """The resolved server args the arithmetic reads."""

    gpu_gib: float
    mem_fraction_static: float
    tp_size: int
    context_len: int
    max_running_requests: int | None
    max_total_tokens: int | None
    max_mamba_cache_size: int | None
    mamba_full_memory_ratio: float
    num_draft_tokens: int  # 0 without speculative decoding
    radix_cache: bool
    extra_buffer: bool
    overlap: bool
    ssm_dtype_bytes: int
    draft_weights_gib: float = 0.0  # the MTP draft's load, counted inside the budget (0.5.14+)
    draft_kv_layers: int = 0  # the draft's attention layers, folded into the KV cell (0.5.19+)
    lazy_extra_buffer: bool = False  # extra_buffer_lazy: one tracking slot up front, overlap or not


@dataclasses.dataclass(frozen=True)
class Capacity:
    """What the startup log and /server_info report."""

    free_before_load_gib: float
    free_after_load_gib: float
    weights_gib: float
    max_total_num_tokens: int
    kv_k_gib: float
    kv_v_gib: float
    max_running_requests: int
    mamba_cache_size: int  # 0 for non-hybrid
    mamba_conv_gib: float
    mamba_ssm_gib: float
    mamba_intermediate_gib: float
    free_after_pools_gib: float
    warnings: tuple[str, ...]


def mamba_ratio(inputs: MemoryInputs) -> int:
    """State slots per running request (`_calculate_mamba_ratio`): 1 without radix cache, else 3 plus the
    extra buffer's tracking slots (`get_mamba_tracking_slots`: 2 with overlap, 1 without or when lazy)."""
    if not inputs.radix_cache:
        return 1
    if not inputs.extra_buffer:
        return MAMBA_BASE_RATIO
    return MAMBA_BASE_RATIO + (2 if inputs.overlap and not inputs.lazy_extra_buffer else 1)


def _rest_gib(inputs: MemoryInputs, shape: ModelShape) -> tuple[float, float]:
    free_before = inputs.gpu_gib - CUDA_CONTEXT_GIB
    free_after = free_before - shape.weights_gib - inputs.draft_weights_gib
    rest = free_after - free_before * (1 - inputs.mem_fraction_static)
    if rest <= 0:
        minimum = 1 - free_after / free_before
        raise ValueError(
            f"Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={inputs.mem_fraction_static}. "
            f"Raise --mem-fraction-static above {math.ceil(minimum * 1000) / 1000:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
            f"decoding, draft weights are now counted."
        )
    return free_before, rest


def _mamba_pool(inputs: MemoryInputs, shape: ModelShape, rest: float) -> tuple[int, float, float]:
    """(max_mamba_cache_size, main state GiB, speculative intermediate GiB)."""
    conv, ssm = shape.mamba_state_bytes(inputs.tp_size, inputs.ssm_dtype_bytes)
    per_req, draft, ratio = conv + ssm, inputs.num_draft_tokens, mamba_ratio(inputs)
    if inputs.max_mamba_cache_size is not None:
        size = inputs.max_mamba_cache_size
    elif not inputs.radix_cache and inputs.max_running_requests is not None:
        size = max(1, inputs.max_running_requests)
    else:
        budget = rest * GIB * inputs.mamba_full_memory_ratio / (1 + inputs.mamba_full_memory_ratio)
        size = int((budget - per_req * (1 + draft)) // (per_req * (1 + draft / ratio)))
    capped = min(max(1, inputs.max_running_requests or 1), max(size, 0) // ratio)
    intermediate = per_req * (capped + 1) * draft / GIB
    if size <= 0:
        raise RuntimeError(
            f"Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
            f"Computed max_mamba_cache_size={size} "
            f"(total_rest_memory={rest - intermediate:.2f} GB, "
            f"mamba_cache_per_req={per_req / (1 << 20):.2f} MB). "
            f"Try: (1) reduce --max-running-requests, "
            f"(2) increase --mem-fraction-static, "
            f"(3) reduce --speculative-num-draft-tokens, or "
            f"(4) use GPUs with more memory."
        )
    return size, (size + 1) * per_req / GIB, intermediate


def _max_running(inputs: MemoryInputs, tokens: int, mamba_size: int, hybrid: bool) -> tuple[int, list[str]]:
    """`resolve_max_num_reqs`: estimate from tokens/context, cap by tokens//2 and the Mamba pool."""
    warnings: list[str] = []
    estimated = max(min(int(tokens / inputs.context_len * 512), 4096), 2048)
    requested = inputs.max_running_requests
    num = min(requested, tokens // 2) if requested is not None else min(estimated, tokens // 2)
    if hybrid:
        ratio = mamba_ratio(inputs)
        cap = mamba_size // ratio
        if cap < num:
            warnings.append(
                f"max_running_requests is capped to {cap} by the mamba state cache "
                f"(max_mamba_cache_size={mamba_size}, {ratio} state slots per request). To raise it: "
                "increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size "
                "with --mamba-ssm-dtype bfloat16."
            )
            num = cap
        if num <= 0:
            raise RuntimeError(
                f"Hybrid (mamba/linear-attention) state cache is too small to serve "
                f"any requests. max_mamba_cache_size={mamba_size}, "
                f"mamba_ratio={ratio}, resulting max_num_reqs={num}. "
                f"Try: (1) reduce --max-running-requests, "
                f"(2) increase --mem-fraction-static, or "
                f"(3) use GPUs with more memory."
            )
    return num, warnings


def compute_capacity(inputs: MemoryInputs, shape: ModelShape) -> Capacity:
    """The pools SGLang would allocate; raises SGLang's ValueError/RuntimeError when they do not fit."""
    free_before, rest = _rest_gib(inputs, shape)
    mamba_size, mamba_gib, intermediate_gib = 0, 0.0, 0.0
    if shape.is_hybrid:
        mamba_size, mamba_gib, intermediate_gib = _mamba_pool(inputs, shape, rest)
    kv_gib = rest - mamba_gib - intermediate_gib
    target_cell = shape.kv_bytes_per_token(inputs.tp_size)
    # `DefaultPoolConfigurator`: the draft's layers scale the cell (its pool gets the same #tokens)
    draft_share = inputs.draft_kv_layers / max(1, shape.num_full_attention_layers)
    tokens = int(kv_gib * GIB // int(target_cell * (1 + draft_share)))
    warnings: list[str] = []
    if inputs.max_total_tokens is not None:
        if inputs.max_total_tokens > tokens:
            warnings.append(
                f"max_total_tokens={inputs.max_total_tokens} is larger than the profiled value "
                f"{tokens}. Use the profiled value instead."
            )
        tokens = min(tokens, inputs.max_total_tokens)
    if tokens <= 0:
        raise RuntimeError(
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={inputs.mem_fraction_static}"
        )
    running, more = _max_running(inputs, tokens, mamba_size, shape.is_hybrid)
    conv, ssm = shape.mamba_state_bytes(inputs.tp_size, inputs.ssm_dtype_bytes)
    half_kv = tokens * target_cell / 2 / GIB
    return Capacity(
        free_before_load_gib=free_before,
        free_after_load_gib=free_before - shape.weights_gib,
        weights_gib=shape.weights_gib,
        max_total_num_tokens=tokens,
        kv_k_gib=half_kv,
        kv_v_gib=half_kv,
        max_running_requests=running,
        mamba_cache_size=mamba_size,
        mamba_conv_gib=(mamba_size + 1) * conv / GIB,
        mamba_ssm_gib=(mamba_size + 1) * ssm / GIB,
        mamba_intermediate_gib=intermediate_gib,
        free_after_pools_gib=free_before
        - shape.weights_gib
        - inputs.draft_weights_gib
        - 2 * half_kv * (1 + draft_share)
        - mamba_gib
        - intermediate_gib,
        warnings=(*warnings, *more),
    )
