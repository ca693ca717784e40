"""vLLM's settings for a job's throughput, in its own flags (pure).

vLLM admits requests while its paged pool has blocks for them and `max-num-seqs` allows (1,024 by default on a
GPU of 70 GiB and more): a request holds ⌈its KV / block⌉ blocks in each attention group, taken as it grows,
and 1 + num_spec (2 + num_spec with prefix caching's `align` mode) in each Mamba group. With the pool full
vLLM preempts the newest, so a full batch runs the job's requests part-way through (`JobShape.live_pages`):
on the H200, 298 ran where the blocks at each request's end give 244. Its sampler's dummy run
is profiled over `max-num-seqs` rows of vocabulary logits (~4.6 GB at 1,024 rows of a 248k vocabulary), so a
`max-num-seqs` sized for the job returns that memory to the pool. The settings: `max-num-seqs` sized for the
job's KV per request (and ¾ of it), `max-model-len` sized to the job, prefix caching off when the prompts
share little, speculative decoding the other way; FP8 KV and a bf16 Mamba cache marked as changing numbers.

What bounds the job's requests: `max-num-seqs` or the paged pool.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fleetgen.plan.job import JobShape
from fleetgen.plan.throughput import used_share
from fleetgen.plan.types import Ask, Setting, Sizing
from fleetgen.plan.vllm.memory import (
    VLLMExtras,
    cpu_kv_space_gib,
    largest_safe_utilization,
    num_spec_tokens,
)

MAX_NUM_SEQS = 4096
DEFAULT_MAX_CAPTURE_TOKENS = 512  # config/vllm.py `default_max_graph_size` (1,024 on SM100: not planned here)
MTP = json.dumps({"method": "mtp", "num_speculative_tokens": 3})
NUMERICS = {
    "kv-cache-dtype": "the KV cache is stored in FP8 (attention reads rounded keys and values)",
    "mamba-ssm-cache-dtype": "the GDN recurrent state is kept in bfloat16 instead of float32",
}

Size = Callable[[Ask], Sizing]
# (blocks in the pool, blocks a request of the job's steady batch holds on average)
Blocks = Callable[[Ask, JobShape], tuple[int, float]]


def graph_requests(args: Mapping[str, Any], seqs: int) -> tuple[int, int]:
    """(the largest decode batch vLLM captures a CUDA graph for, in requests; its capture size in tokens): the
    `max-cudagraph-capture-size` given, else min(max_num_seqs × query length × 2, 512) tokens, a decode step
    taking 1 + num_speculative_tokens a request (`VllmConfig._set_cudagraph_sizes`, config/vllm.py; 512 =
    "largest" in vLLM 0.24's log on the H200)."""
    query = 1 + num_spec_tokens(args)
    given = args.get("max-cudagraph-capture-size")
    cap = int(given) if given else min(seqs * query * 2, DEFAULT_MAX_CAPTURE_TOKENS)
    return cap // query, cap


def job_bound(blocks: Blocks, ask: Ask, job: JobShape, seqs: int) -> tuple[int, str]:
    """The job's running requests and what bounds them: max-num-seqs (`seqs`, given or vLLM's default), or
    the pool's blocks over the blocks a request of its steady batch holds (vLLM allocates as requests grow
    and preempts the newest when the pool runs out, so a full pool runs requests part-way through); past its
    CUDA-graph capture size decode runs without full graphs, said so."""
    pool, per_request = blocks(ask, job)
    by_blocks = int(pool // max(per_request, 1.0))
    if by_blocks < seqs:
        running = by_blocks
        bound = f"the paged pool's {pool:,} blocks ÷ {per_request:.1f} a running request of this job"
    else:
        running, bound = seqs, f"max-num-seqs {seqs}"
    graphs, cap = graph_requests(ask.args, seqs)
    if running > graphs:
        bound += (
            f"; decode past {graphs} running runs without full CUDA graphs (vLLM's capture size {cap} "
            "tokens: --max-cudagraph-capture-size)"
        )
    return running, bound


def _most(size: Size, blocks: Blocks, ask: Ask, args: Mapping[str, Any], job: JobShape) -> int:
    """The largest max-num-seqs whose requests' blocks the pool (sized with that many sampler rows) holds."""

    def fits(n: int) -> bool:
        trial = replace(ask, args={**args, "max-num-seqs": n})
        if not size(trial).fits:
            return False
        pool, per_request = blocks(trial, job)
        return n * per_request <= pool

    return bisect_left(range(1, MAX_NUM_SEQS + 1), True, key=lambda n: not fits(n))


def settings(size: Size, blocks: Blocks, ask: Ask, job: JobShape) -> list[Setting]:
    """vLLM's throughput settings for this job, best planned first (the ranking is `plan.throughput`'s)."""
    ctx = min(-(-job.context_tokens // 256) * 256, ask.shape.context_length)
    base = {**ask.args, "max-model-len": ctx}
    what = [f"--max-model-len {ctx}"]
    if base.get("enable-prefix-caching") and job.shared_prefix_tokens < 0.25 * job.kv_tokens_per_request:
        base.pop("enable-prefix-caching")
        what.append("prefix caching off")
    variants = [("", what, base)]
    spec = "speculative-config" in base
    if spec:
        plain = {k: v for k, v in base.items() if k != "speculative-config"}
        variants.append(("-nospec", ["no speculative decoding", *what], plain))
    elif ask.shape.mtp_layers:
        variants.append(
            ("-mtp", ["MTP speculative decoding (3 tokens)", *what], {**base, "speculative-config": MTP})
        )
    out: list[Setting] = []
    for suffix, words, args in variants:
        n = _most(size, blocks, ask, args, job)
        for k in dict.fromkeys((n, n * 3 // 4)):
            if k:
                change = ", ".join([*words, f"--max-num-seqs {k}"])
                out.append(_offer(size, blocks, ask, job, f"max-num-seqs-{k}{suffix}", change, args, k))
    if not cpu_kv_space_gib(ask.env):  # the CPU build's KV space is its env's, not a fraction
        for variant in variants:
            out += _utilizations(size, blocks, ask, job, variant)
    for flag, value in (("kv-cache-dtype", "fp8"), ("mamba-ssm-cache-dtype", "bfloat16")):
        args = {**base, flag: value}
        n = _most(size, blocks, ask, args, job)
        if n and flag not in ask.args:
            change = ", ".join([*what, f"--max-num-seqs {n}", f"--{flag} {value}"])
            name = f"max-num-seqs-{n}-{value}"
            out.append(_offer(size, blocks, ask, job, name, change, args, n, numerics=NUMERICS[flag]))
    return out


def _utilizations(
    size: Size, blocks: Blocks, ask: Ask, job: JobShape, variant: tuple[str, list[str], dict[str, Any]]
) -> list[Setting]:
    """`max-num-seqs` sized again at each higher `--gpu-memory-utilization` (in hundredths, up to the largest
    the plan holds safe: `largest_safe_utilization`): the one running the most (the lowest such), and two
    hundredths below it, a step safer; as SGLang's static fraction is searched."""
    suffix, words, base = variant
    start = VLLMExtras.of(size(replace(ask, args=base)).memory).gpu_memory_utilization
    top = largest_safe_utilization(ask)
    found = {
        f / 100: _most(size, blocks, ask, {**base, "gpu-memory-utilization": f / 100}, job)
        for f in range(round(start * 100) + 1, round(top * 100) + 1)
    }
    if not found or max(found.values()) <= _most(size, blocks, ask, base, job):
        return []
    best = max(found, key=lambda f: (found[f], -f))
    out = []
    for f in dict.fromkeys([best, round(best - 0.02, 2)]):
        n = found.get(f, 0)
        if n and n > _most(size, blocks, ask, base, job):
            args = {**base, "gpu-memory-utilization": f}
            change = ", ".join([*words, f"--max-num-seqs {n}", f"--gpu-memory-utilization {f:.2f}"])
            name = f"max-num-seqs-{n}-gmu{round(f * 100)}{suffix}"
            out.append(_offer(size, blocks, ask, job, name, change, args, n))
    return out


def _offer(
    size: Size,
    blocks: Blocks,
    ask: Ask,
    job: JobShape,
    name: str,
    change: str,
    args: Mapping[str, Any],
    n: int,
    numerics: str = "",
) -> Setting:
    trial = replace(ask, args={**args, "max-num-seqs": n})
    sized = size(trial)
    running, bound = job_bound(blocks, trial, job, n)
    return Setting(
        name,
        change,
        trial.args,
        dict(trial.env),
        running,
        bound,
        sized.memory.kv_tokens,
        is_spec="speculative-config" in trial.args,
        numerics=numerics,
        used_share=used_share(sized.memory, running, job),
    )
