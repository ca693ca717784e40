"""Serving a job, not the defaults: how many of the job's requests an instance runs, what bounds them, and the
settings that raise them (pure).

An engine's defaults are sized for chat: SGLang's radix cache holds ρ Mamba slots per running request (ρ = 5
with extra_buffer + overlap), so a hybrid model on a 96 GB GPU runs 8 requests while most of its memory sits
idle. For a job of distinct prompts the cache buys nothing; each engine offers its own settings that size the
pools for the job (`Planner.settings`, in its flags for the release planned). This module holds what they
share: the job's running requests on a sizing, the share of the budget they use, the user's own flags as the
first setting, the ranking, and the loud warning when the user's flags leave most of the GPU to no request.

The idle-GPU warning is the `job-throughput` issue.
"""

from __future__ import annotations

from dataclasses import replace

from fleetgen.plan.job import JobShape
from fleetgen.plan.types import Ask, Issue, JobPlan, Memory, Planner, Setting, Sizing

# Below this share of the static budget filled by the job's running requests, the plan says so loudly.
IDLE_SHARE = 0.5


def used_share(m: Memory, running: int, job: JobShape) -> float:
    """The share of what the budget leaves after the weights that `running` of the job's requests fill in a
    steady batch: their recurrent state (and its copies) and the KV each holds part-way through."""
    if m.rest_bytes <= 0:
        return 0.0
    per_request = m.state_bytes_per_request + job.live_kv_tokens * m.kv_bytes_per_token
    return min(running * per_request / m.rest_bytes, 1.0)


def job_running(planner: Planner, ask: Ask, sized: Sizing, job: JobShape) -> tuple[int, str]:
    """The job's requests a sizing runs at once and what bounds them: the engine's own reading where it has
    one (`Planner.bound`), else its cap or its KV pool over the job's KV per request, whichever is less."""
    if planner.bound is not None:
        return planner.bound(ask, sized, job)
    m = sized.memory
    by_kv = int(m.kv_tokens // max(job.kv_tokens_per_request, 1.0))
    if by_kv < m.max_running_requests:
        return by_kv, f"the KV pool's {m.kv_tokens:,} tokens ÷ {job.kv_tokens_per_request:,.0f} per request"
    return m.max_running_requests, f"{planner.engine.name}'s own cap"


def plan_job(planner: Planner, ask: Ask, sized: Sizing, job: JobShape) -> JobPlan:
    """The user's flags as the first setting, the engine's after them (ranked by the running requests they
    plan: `tune` measures them), and the warning when the user's leave most of the budget unused."""
    running, bound = job_running(planner, ask, sized, job)
    share = used_share(sized.memory, running, job)
    mine = Setting(
        "as-written", "", ask.args, ask.env, running, bound, sized.memory.kv_tokens, used_share=share
    )
    offered = sorted(planner.settings(ask, job), key=lambda s: (bool(s.numerics), -s.running))
    result = JobPlan((mine, *offered))
    best = result.best
    if share < IDLE_SHARE and best.running > running:
        result = replace(result, warning=_idle_warning(mine, best, job))
    return result


def max_length_issue(job: JobShape) -> Issue | None:
    """The warning when a row can outgrow the trainer: `max_tokens` + the longest prompt past the job's
    `max_length` (the tokens past it are generated, paid for, and cut at training); None when it fits."""
    if job.max_length is None:
        return None
    longest = job.longest_prompt_tokens + job.max_tokens
    if longest <= job.max_length:
        return None
    fitting = job.max_length - job.longest_prompt_tokens
    lower = f"lower max_tokens to {fitting}" if fitting > 0 else "shorten the longest prompts"
    return Issue(
        "max-length",
        f"max_tokens {job.max_tokens:,} + the longest prompt {job.longest_prompt_tokens:,} = {longest:,} "
        f"tokens, past the trainer's max_length {job.max_length:,}: up to {longest - job.max_length:,} "
        "tokens of such a row are generated, paid for, and cut at training",
        f"{lower}, raise the trainer's max_length to {longest:,}, or keep it and count what is cut: "
        f"`fleetgen export --max-length {job.max_length}` says how many generated tokens fall past it",
    )


def _idle_warning(mine: Setting, best: Setting, job: JobShape) -> Issue:
    shared = "share no prefix" if job.prefix_share < 0.05 else f"share {job.prefix_share:.0%} of their tokens"
    return Issue(
        "job-throughput",
        f"{mine.running} running requests for this job: {mine.bound}; they fill {mine.used_share:.0%} of "
        f"the memory left after the weights. These prompts {shared}: with {best.change} each request holds "
        f"one state and {best.running} fit with this job's KV per request "
        f"({job.kv_tokens_per_request:,.0f} tokens)",
        f"use {best.change}, or let `fleetgen tune` measure the settings below on the GPU",
    )
