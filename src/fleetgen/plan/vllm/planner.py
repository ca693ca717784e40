"""vLLM's `Planner`: its memory arithmetic (`memory`), its ways out and concurrency flags, and its settings
for a job's throughput (`throughput`) over the blocks of its paged pool (pure)."""

from __future__ import annotations

from fleetgen.engines import get_engine
from fleetgen.engines.vllm import VLLMEngine
from fleetgen.plan.types import Ask, Planner
from fleetgen.plan.vllm import throughput
from fleetgen.plan.vllm.memory import (
    VLLMExtras,
    concurrency,
    max_num_seqs,
    pool_layout,
    size_instance,
    variants,
)


def job_blocks(ask: Ask, tokens: int) -> tuple[int, int]:
    """(the paged pool's blocks, the blocks one request holding `tokens` takes) for these flags."""
    pool = VLLMExtras.of(size_instance(ask).memory).num_blocks
    return pool, pool_layout(ask.shape, ask.args, ask.tp, tokens).blocks_per_request


PLANNER = Planner(
    get_engine(VLLMEngine.name),
    size_instance,
    variants,
    concurrency,
    settings=lambda ask, job: throughput.settings(size_instance, job_blocks, ask, job),
    bound=lambda ask, _sized, job: throughput.job_bound(job_blocks, ask, job, max_num_seqs(ask)),
)
