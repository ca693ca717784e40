"""How many of a job's requests SGLang's scheduler admits at once on its KV pool (pure).

SGLang admits a waiting request only while its KV pool has room for it beyond what the running requests
hold and what it reserves for them (`PrefillAdder`, `managers/schedule_policy.py`, the same in 0.5.15 and
0.5.17; `scheduler.py` builds it with `NewTokenRatioTracker.current`):
- a new request needs `extend_input_len + min(max_new_tokens, CLIP_MAX_NEW_TOKENS) + page_size` tokens
  below `rem_total_tokens` (`add_one_req`: `total_tokens >= self.rem_total_tokens` → NO_TOKEN): its
  prompt and its whole output up to the 4,096-token clip;
- `rem_total_tokens` is the pool's free tokens less, per running request, `min(max_new_tokens −
  len(output_ids), CLIP_MAX_NEW_TOKENS) × new_token_ratio` (`_get_running_request_total_token_offset`); the
  ratio starts at `SGLANG_INIT_NEW_TOKEN_RATIO` 0.7 and decays each decode step without a retraction to
  0.7 × `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR` 0.14 over 600 steps (`new_token_ratio_tracker.py`);
- a speculative request holds its decode's over-allocation ahead of what it committed:
  `get_alloc_reserve_per_decode` = 2 × max(steps × topk, draft tokens) tokens (`mem_cache/common.py`).
In a steady batch each running request holds the job's live KV (`JobShape.live_kv_tokens`: prompt and the
part written), so n run where `(n − 1) × held + new < pool`. That binds below the pool's share per request
at its end where the pool is tight: the new request's 4,096 clipped tokens are a fixed cost that a small
pool (MTP's, beside its large intermediate SSM cache) feels most.

Tune's forced lengths (`ignore_eos`) take the engine's other path (`add_one_req_ignore_eos`: the batch must
finish without overflowing the pool as its requests end in order), which for a steady batch comes to the
KV it holds now: looser than the run's, so the run's figure here is the one planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetgen.plan.job import JobShape

# schedule_policy.py (0.5.15, 0.5.17): SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION's default
CLIP_MAX_NEW_TOKENS = 4096
# environ.py (0.5.15, 0.5.17): SGLANG_INIT_NEW_TOKEN_RATIO × SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, the ratio a
# steady batch without retractions decays to
STEADY_NEW_TOKEN_RATIO = 0.7 * 0.14
# an admission under this share of what the pools plan is "far fewer": the setting is not offered
FAR_FEWER = 0.5


@dataclass(frozen=True)
class Admission:
    """What SGLang admits of the job on a pool: `running` requests, each holding `held_tokens` of its pool
    (its live KV, the ratio's reserve for its remaining output, the speculative over-allocation), and a new
    one needing `new_request_tokens` free beyond them."""

    running: int
    pool_tokens: int
    held_tokens: float
    new_request_tokens: int
    reserve_tokens: float
    spec_tokens: int

    def text(self) -> str:
        """Why, in SGLang's terms."""
        spec = f" + {self.spec_tokens} speculative over-allocation" if self.spec_tokens else ""
        return (
            f"SGLang's KV admission: {self.running} of the job's requests on its {self.pool_tokens:,}-token "
            f"pool (each running one holds {self.held_tokens:,.0f}: its live KV, "
            f"{self.reserve_tokens:,.0f} reserved for its remaining output at new_token_ratio "
            f"{STEADY_NEW_TOKEN_RATIO:.3f}{spec}; a new one needs {self.new_request_tokens:,} free: its "
            f"prompt + min(max_tokens, {CLIP_MAX_NEW_TOKENS}))"
        )


def spec_over_allocation(draft_tokens: int, steps_topk: int = 0) -> int:
    """Tokens a speculative request holds ahead of its committed KV (`get_alloc_reserve_per_decode`: twice
    `get_alloc_len_per_decode`, max(steps × topk, draft tokens) at page size 1); 0 without speculation."""
    return 2 * max(draft_tokens, steps_topk) if draft_tokens else 0


def remaining_reserve(job: JobShape) -> float:
    """The mean `min(max_tokens − written, CLIP)` over a steady batch's requests: each output length L
    weighted by how long it runs (L), its written part w uniform over [0, L)."""
    cap, clip = job.max_tokens, CLIP_MAX_NEW_TOKENS
    edge = max(cap - clip, 0)  # written past this, the remaining is below the clip
    lengths = job.output_tokens.points
    total = 0.0
    for length in lengths:
        flat = min(length, edge)
        total += clip * flat
        if length > edge:
            total += cap * (length - edge) - (length * length - edge * edge) / 2
    return total / math.fsum(lengths)


def admitted(pool_tokens: int, job: JobShape, *, spec_tokens: int = 0, page_size: int = 1) -> Admission:
    """The most of the job's requests SGLang runs at once on `pool_tokens` of KV in a steady batch."""
    reserve = STEADY_NEW_TOKEN_RATIO * remaining_reserve(job)
    held = job.live_kv_tokens + reserve + spec_tokens
    new = math.ceil(job.prompt_tokens.mean) + min(job.max_tokens, CLIP_MAX_NEW_TOKENS) + page_size
    # the k-th is admitted while new < pool − (k − 1) × held (strictly: `total_tokens >= rem_total` refuses)
    running = 0 if new >= pool_tokens else math.ceil((pool_tokens - new) / held)
    return Admission(running, pool_tokens, held, new, reserve, spec_tokens)
