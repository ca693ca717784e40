"""vLLM's GPU-memory arithmetic (pure): `--gpu-memory-utilization` is a fraction of TOTAL memory.

`Worker.determine_available_memory`: requested = total × util; KV = requested − weights − peak activations
(− CUDA graphs). Hybrid GDN state lives in the same paged pool: each request holds 1 + num_speculative_tokens
Mamba blocks next to its attention blocks, so there is no fixed Mamba:KV split to plan.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetgen.engines import RuleSet
from fleetgen.modelcard import DTYPE_BYTES, ModelShape
from fleetgen.plan.sglang import kv_bytes_per_token, state_bytes_per_request
from fleetgen.plan.types import GIB, Issue, Memory

ACTIVATION_BYTES_PER_TOKEN = 512 * 1024  # peak activation estimate per batched token (not measured)
GRAPH_BYTES = 1 * GIB  # CUDA-graph pool estimate
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BATCHED_TOKENS = 8192

FREE_LESS_THAN_UTIL = (
    "Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is less than desired GPU memory "
    "utilization ({util}, {req:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
    "processes."
)
ONE_REQUEST = (
    "To serve at least one request with the model's max seq len ({ctx}), ({need:.2f} GiB KV cache is needed, "
    "which is larger than the available KV cache memory ({avail:.2f} GiB)."
)


def _num_spec_tokens(args: Mapping[str, Any]) -> int:
    raw = args.get("speculative-config")
    if not raw:
        return 0
    try:
        conf = json.loads(str(raw))
    except json.JSONDecodeError:
        return 0
    return int(conf.get("num_speculative_tokens", 0)) if isinstance(conf, dict) else 0


def size_vllm(
    shape: ModelShape, args: Mapping[str, Any], rules: RuleSet, *, tp: int, free_bytes: int, total_bytes: int
) -> tuple[Memory, list[Issue]]:
    """The per-GPU plan of one vLLM instance, and the start-up errors vLLM would raise."""
    util = float(args.get("gpu-memory-utilization") or rules.default_gpu_memory_utilization)
    requested = int(total_bytes * util)
    num_spec = _num_spec_tokens(args)
    weights = shape.weight_bytes // tp if num_spec else (shape.weight_bytes - shape.mtp_weight_bytes) // tp
    batched = int(args.get("max-num-batched-tokens") or DEFAULT_BATCHED_TOKENS)
    activations = batched * ACTIVATION_BYTES_PER_TOKEN + (0 if args.get("enforce-eager") else GRAPH_BYTES)
    kv_pool = max(requested - weights - activations, 0)
    kv_dtype = str(args.get("kv-cache-dtype") or "auto")
    cell = kv_bytes_per_token(
        shape, tp, shape.dtype_bytes if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, 1)
    )
    ssm = str(args.get("mamba-ssm-cache-dtype") or shape.ssm_dtype)
    state = state_bytes_per_request(shape, tp, "float32" if ssm == "auto" else ssm)
    ctx = int(args.get("max-model-len") or shape.context_length)
    per_request = ctx * cell + (1 + num_spec) * state
    seqs = int(args.get("max-num-seqs") or DEFAULT_MAX_NUM_SEQS)
    memory = Memory(
        free_bytes=free_bytes,
        mem_fraction_static=util,
        budget_bytes=requested,
        weights_bytes=weights,
        rest_bytes=kv_pool,
        kv_bytes_per_token=cell,
        state_bytes_per_request=state,
        kv_pool_bytes=kv_pool,
        kv_tokens=kv_pool // cell if cell else 0,
        spec_scratch_bytes=0,
        max_running_requests=min(seqs, kv_pool // per_request) if per_request else 0,
        headroom_bytes=total_bytes - requested,
        headroom_needed_bytes=activations,
        context_length=ctx,
    )
    return memory, _errors(memory, free_bytes, total_bytes, per_request)


def _errors(m: Memory, free_bytes: int, total_bytes: int, per_request: int) -> list[Issue]:
    """vLLM's start-up refusals in its words: free memory short of the request, or no room for one."""
    requested = m.budget_bytes
    if free_bytes < requested:
        text = FREE_LESS_THAN_UTIL.format(
            free=free_bytes / GIB, total=total_bytes / GIB, util=m.mem_fraction_static, req=requested / GIB
        )
        return [Issue("gpu-memory-utilization", text, "lower gpu-memory-utilization or free the GPU")]
    if m.kv_pool_bytes < per_request:
        text = ONE_REQUEST.format(ctx=m.context_length, need=per_request / GIB, avail=m.kv_pool_bytes / GIB)
        return [Issue("kv-cache", text, "raise gpu-memory-utilization, lower max-model-len or use tp = 2")]
    return []
