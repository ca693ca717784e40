"""SGLang's admission of a job's requests on its KV pool (`plan.sglang.admission`), against the scheduler's
own rule played out request by request (`PrefillAdder.add_one_req`, schedule_policy.py 0.5.15/0.5.17), and
against the runs it must agree with: the H200's MTP candidate (SGLang 0.5.15, tune job, 124,727 KV tokens:
the plan's 66 is what ran) and the H100's MTP candidates that ran their planned batch (8 at 0.85, 18 at 0.92,
21 at 0.95: ../shared/data/real-engines/sglang-0.5.15-h100-tune/). The H100's candidate at 11 that ran 1 is
no admission: its pool admits 16 (`test_steady.py`'s stall test says what that window was)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.plan.job import JobShape, LengthStats
from fleetgen.plan.sglang.admission import (
    CLIP_MAX_NEW_TOKENS,
    admitted,
    remaining_reserve,
    spec_over_allocation,
)
from fleetgen.plan.sglang.throughput import bound_of
from fleetgen.plan.throughput import plan_job
from fleetgen.plan.types import MIB, JobPlan
from fleetgen.tune.session import candidates_for
from tests.unit.plan.test_real_engines import tune_job
from tests.unit.plan.test_throughput import MTP, SGLANG, ask, job

H100_TOTAL = 81_559 * MIB  # H100 80GB HBM3, nothing else on it
H100_MTP = {
    **MTP,
    "context-length": 6400,
    "disable-radix-cache": True,
    "mamba-radix-cache-strategy": "no_buffer",
}


def shape(prompt: int, outputs: list[int], max_tokens: int) -> JobShape:
    return replace(job(prompt=prompt, max_tokens=max_tokens), output_tokens=LengthStats.of(outputs))


def scheduler_admits(pool: int, held: float, new: int) -> int:
    """SGLang's loop: with k running, each holding `held`, the next is admitted while its `new` tokens are
    below what is left (`total_tokens >= rem_total_tokens` refuses it)."""
    k = 0
    while new < pool - k * held:
        k += 1
    return k


@settings(max_examples=200, deadline=None)
@given(
    pool=st.integers(0, 400_000),
    prompt=st.integers(1, 3000),
    outputs=st.lists(st.integers(1, 9000), min_size=1, max_size=40),
    spec=st.sampled_from([0, 2, 4, 8]),
)
def test_the_admitted_count_is_what_the_schedulers_own_loop_admits(
    pool: int, prompt: int, outputs: list[int], spec: int
) -> None:
    j = shape(prompt, outputs, max(outputs) + random.Random(pool).randint(0, 4000))
    a = admitted(pool, j, spec_tokens=spec_over_allocation(spec))
    assert a.running == scheduler_admits(pool, a.held_tokens, a.new_request_tokens)
    assert (
        a.new_request_tokens == math.ceil(j.prompt_tokens.mean) + min(j.max_tokens, CLIP_MAX_NEW_TOKENS) + 1
    )
    # more pool never admits fewer; a new request needs its own whole clipped output free
    assert admitted(pool + 5000, j).running >= admitted(pool, j).running
    assert (a.running == 0) == (pool <= a.new_request_tokens)


@given(outputs=st.lists(st.integers(1, 9000), min_size=1, max_size=12), extra=st.integers(0, 6000))
def test_the_reserve_is_the_clipped_remaining_output_over_a_steady_batch(
    outputs: list[int], extra: int
) -> None:
    """Each length L weighted by how long it runs, its written part w uniform over 0..L−1: the mean of
    min(max_tokens − w, 4096), summed token by token."""
    cap = max(outputs) + extra
    total = sum(min(cap - w, CLIP_MAX_NEW_TOKENS) for n in outputs for w in range(n))
    exact = total / sum(outputs)
    assert remaining_reserve(shape(10, outputs, cap)) == pytest.approx(exact, rel=0.002, abs=0.6)


def test_speculation_holds_twice_its_decode_allocation_ahead() -> None:
    """`get_alloc_reserve_per_decode` (mem_cache/common.py, 0.5.15): 2 × max(steps × topk, draft tokens)."""
    assert spec_over_allocation(4) == 8 and spec_over_allocation(0) == 0 and spec_over_allocation(4, 6) == 12


def _mtp_bound(mfs: float, n: int) -> tuple[int, str]:
    a = ask(
        total=H100_TOTAL,
        free=H100_TOTAL,
        args={**H100_MTP, "mem-fraction-static": mfs, "max-running-requests": n},
    )
    return bound_of(a, SGLANG.size(a), tune_job())


@pytest.mark.parametrize(("mfs", "ran"), [(0.85, 8), (0.92, 18), (0.95, 21)])
def test_the_h100_mtp_candidates_that_ran_their_batch_are_planned_at_it(mfs: float, ran: int) -> None:
    running, _ = _mtp_bound(mfs, ran)
    assert running == ran


def test_the_h200_mtp_pool_admits_what_ran_and_the_pool_at_its_end_binds() -> None:
    """124,727 tokens (the engine's), the tune job: 66 ran; SGLang's admission lets in 72 of a steady
    batch, each request at its end bounds first (66)."""
    a = admitted(124_727, tune_job(), spec_tokens=spec_over_allocation(4))
    assert a.running >= 66 and "0.098" in a.text() and f"{CLIP_MAX_NEW_TOKENS}" in a.text()


def planned(gib: int, prompt: int, output: int, max_tokens: int, spec: bool) -> tuple[JobPlan, JobShape]:
    j = job(prompt=prompt, output=output, max_tokens=max_tokens)
    a = ask(total=gib << 30, free=gib << 30, args={"mem-fraction-static": 0.9, **(MTP if spec else {})})
    return plan_job(SGLANG, a, SGLANG.size(a), j), j


@settings(max_examples=25, deadline=None)
@given(
    gib=st.sampled_from([80, 141]),
    prompt=st.sampled_from([50, 2000, 6000]),
    output=st.integers(50, 1500),
    max_tokens=st.sampled_from([4096, 16384]),
    spec=st.booleans(),
)
def test_every_offered_setting_runs_no_more_than_sglang_admits_and_the_rest_say_why(
    gib: int, prompt: int, output: int, max_tokens: int, spec: bool
) -> None:
    """An offered setting plans no more running than its pool admits; one withheld runs 0 and says, in
    SGLang's terms, that its admission runs far fewer than its pools hold. Tune measures none of 0 (withheld,
    or refused by the engine's own rules: its bound says which)."""
    plan, j = planned(gib, prompt, output, max_tokens, spec)
    for s in plan.settings:
        if s.running:
            assert admitted(s.kv_tokens, j, spec_tokens=8 if s.is_spec else 0).running >= s.running
        elif "admission" in s.bound:
            assert s.bound.startswith("withheld: SGLang's KV admission") and "far fewer than the" in s.bound
    measured = candidates_for(SimpleNamespace(job=plan), allow_numerics=True)  # type: ignore[arg-type]
    assert measured[0] is plan.as_written and all(s.running > 0 for s in measured[1:])


def test_long_prompts_with_short_outputs_are_bound_by_the_admission_and_say_so() -> None:
    """6,000-token prompts writing 100 tokens on an H100: each running request keeps 0.098 × its clipped
    remaining output reserved beside its KV, more than its output itself: the admission binds, named."""
    plan, j = planned(80, 6000, 100, 4096, False)
    mine = plan.as_written
    offered = [s for s in plan.settings[1:] if s.running and not s.numerics]
    bound = [s for s in offered if s.bound.startswith("SGLang's KV admission")]
    assert bound and all(s.running == admitted(s.kv_tokens, j).running for s in bound)
    # the pools are sized for what SGLang admits: no Mamba slot for a request it would never run
    assert all(s.args["max-running-requests"] == s.running for s in bound)
    assert all(s.running < s.kv_tokens // j.kv_tokens_per_request for s in bound)
    assert mine.running >= 1
