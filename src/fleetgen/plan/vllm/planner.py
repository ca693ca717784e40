"""vLLM's `Planner`: its memory arithmetic (`memory`), its ways out and concurrency flags, and its settings
for a job's throughput (`throughput`) over the blocks of its paged pool (pure)."""

from __future__ import annotations

from fleetgen.engines import get_engine
from fleetgen.engines.vllm import VLLMEngine
from fleetgen.plan.job import JobShape
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


def job_blocks(ask: Ask, job: JobShape) -> tuple[int, float]:
    """(the paged pool's blocks, the blocks a request of this job's steady batch holds on average) for these
    flags: vLLM allocates a request's blocks as it grows, so a full batch holds requests part-way through."""
    sized = size_instance(ask)
    extras = VLLMExtras.of(sized.memory)
    pool = pool_layout(ask.shape, ask.args, ask.tp, sized.memory.context_length, extras.block_size)
    return extras.num_blocks, pool.paged_groups * job.live_pages(pool.block_size) + pool.fixed_blocks


PLANNER = Planner(
    get_engine(VLLMEngine.name),
    size_instance,
    variants,
    concurrency,
    settings=lambda ask, job: throughput.settings(size_instance, job_blocks, ask, job),
    bound=lambda ask, _sized, job: throughput.job_bound(job_blocks, ask, job, max_num_seqs(ask)),
)
