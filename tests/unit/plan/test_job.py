"""The job's shape as values (`plan.job`): length stats, output-length distributions and their spec, the
figures planning derives. Pure: no files."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleetgen.errors import ConfigError
from fleetgen.plan.job import (
    SPREAD_POINTS,
    EmpiricalLengths,
    JobShape,
    LengthStats,
    LogNormalLengths,
    _between,
    default_sigma,
    expected_output,
)

lengths = st.lists(st.integers(1, 200_000), min_size=1, max_size=300)


@st.composite
def specs(draw: st.DrawFn) -> LogNormalLengths:
    """A lognormal spec as users give them: a range of outputs and a mean inside it."""
    low = draw(st.integers(1, 2000))
    high = draw(st.integers(low * 2, 200_000))
    mean = draw(st.floats(low + 0.05 * (high - low), high - 0.3 * (high - low)))
    sigma = draw(st.one_of(st.none(), st.floats(0.1, 2.0)))
    text = f"mean={mean!r},min={low},max={high}" + ("" if sigma is None else f",sigma={sigma!r}")
    try:
        return LogNormalLengths.parse(text)
    except ConfigError as exc:
        assume("too close" not in exc.message)  # a mean the sigma cannot reach: refused, tested below
        raise


@given(lengths)
def test_length_stats_are_nearest_rank_members_in_order(values: list[int]) -> None:
    stats = LengthStats.of(values)
    ordered = sorted(values)
    assert stats.count == len(values) and stats.max == ordered[-1]
    assert ordered[0] <= stats.p50 <= stats.p90 <= stats.p99 <= stats.max
    assert math.isclose(stats.mean, statistics.fmean(values))
    for p, value in ((0.5, stats.p50), (0.9, stats.p90), (0.99, stats.p99)):
        assert value in values
        assert sum(v <= value for v in values) >= p * len(values)  # at least a share p at or below it
        assert sum(v < value for v in values) < p * len(values)  # and the smallest such value


def test_length_stats_refuse_nothing_to_summarise() -> None:
    with pytest.raises(ValueError):
        LengthStats.of([])


@settings(max_examples=60, deadline=None)
@given(specs(), st.integers(0, 2**32))
def test_lognormal_draws_stay_in_range_reproducibly_and_have_the_asked_mean(
    spec: LogNormalLengths, seed: int
) -> None:
    """Invariant: every draw is within [min, max]; the same seed draws the same lengths; the mean of many
    draws is the asked mean (within 4 standard errors and rounding to whole tokens)."""
    first = spec.sample(random.Random(seed))
    rng = random.Random(seed)
    many = [spec.sample(rng) for _ in range(20_000)]
    assert many[0] == first
    assert all(spec.min <= x <= spec.max for x in many)
    standard_error = statistics.stdev(many) / math.sqrt(len(many))
    assert abs(statistics.fmean(many) - spec.mean) <= 4 * standard_error + 0.01 * spec.mean + 0.5


@given(specs())
def test_lognormal_stats_are_its_quantiles_in_order(spec: LogNormalLengths) -> None:
    stats = spec.stats
    assert stats.count == 0 and stats.mean == spec.mean and stats.max == spec.max
    assert spec.min <= stats.p50 <= stats.p90 <= stats.p99 <= spec.max


def test_the_issues_job_spec_reads_as_asked() -> None:
    spec = LogNormalLengths.parse("mean=1800,min=300,max=6000")
    assert (spec.mean, spec.min, spec.max) == (1800, 300, 6000)
    # sigma from the range: [300, 6000] are the 1st and 99th percentiles of the untruncated lognormal
    assert spec.sigma == pytest.approx(math.log(20) / (2 * 2.3263), rel=1e-4)
    assert LogNormalLengths.parse("max=50, mean=10").min == 1  # min defaults to one token
    assert LogNormalLengths.parse("mean=1800,min=300,max=6000,sigma=0.3").sigma == 0.3
    rng = random.Random(7)
    draws = [spec.sample(rng) for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(1800, rel=0.02)
    assert statistics.median(draws) == pytest.approx(spec.stats.p50, rel=0.02)


@pytest.mark.parametrize("mean", [310, 5800])
def test_a_mean_near_either_end_is_reached_counting_from_that_tail(mean: int) -> None:
    """A job whose outputs mostly sit at the range's short (or long) end: the location is found far out, and
    draws there (probabilities near 0 or 1) still have the asked mean."""
    spec = LogNormalLengths.parse(f"mean={mean},min=300,max=6000")
    rng = random.Random(5)
    assert statistics.fmean(spec.sample(rng) for _ in range(20_000)) == pytest.approx(mean, rel=0.01)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("mean=1800,min=300", "no max="),
        ("min=300,max=6000", "no mean="),
        ("mean=abc,max=6000", "'mean=abc'"),
        ("mean=1800,max=inf", "'max=inf'"),
        ("mean=1800,maximum=6000", "'maximum=6000'"),
        ("mean 1800,max=6000", "'mean 1800'"),
        ("mean=1800,min=300.5,max=6000", "min=300.5 is not a whole number"),
        ("mean=7000,min=300,max=6000", "mean=7000 must lie strictly between"),
        ("mean=300,min=300,max=6000", "mean=300 must lie strictly between"),
        ("mean=10,min=60,max=50", "need 1 ≤ min < max"),
        ("mean=10,min=0,max=50", "need 1 ≤ min < max"),
        ("mean=1800,max=6000,sigma=0", "sigma=0 must be in"),
        ("mean=5990,min=300,max=6000", "too close to min=300 or max=6000"),
    ],
)
def test_a_bad_spec_names_the_bad_part_and_the_fix(spec: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        LogNormalLengths.parse(spec)
    assert named in caught.value.message and caught.value.message.startswith("output lengths: ")
    assert "mean=1800,min=300,max=6000" in caught.value.fix or "sigma=" in caught.value.fix


def test_default_sigma_widens_with_the_range() -> None:
    assert default_sigma(300, 6000) < default_sigma(30, 6000)
    assert default_sigma(100, 100 * math.e ** (2 * 2.3263)) == pytest.approx(1.0, rel=1e-4)


@given(st.lists(st.integers(1, 9000), min_size=1, max_size=50), st.integers(0, 2**32))
def test_empirical_draws_are_observed_lengths_reproducibly(values: list[int], seed: int) -> None:
    lengths = EmpiricalLengths(tuple(values), "test")
    first = lengths.sample(random.Random(seed))
    rng = random.Random(seed)
    drawn = [lengths.sample(rng) for _ in range(50)]
    assert drawn[0] == first and set(drawn) <= set(values)
    assert lengths.stats == LengthStats.of(values)


def test_expected_output_is_the_ceiling_without_lengths_and_refuses_lengths_past_max_tokens() -> None:
    stats, note = expected_output(None, 4096)
    assert stats == LengthStats(0, 4096.0, 4096, 4096, 4096, 4096, (4096,)) and "ceiling" in note
    spec = LogNormalLengths.parse("mean=1800,min=300,max=6000")
    assert expected_output(spec, 6000) == (spec.stats, spec.source)
    with pytest.raises(ConfigError) as caught:
        expected_output(spec, 4096)
    assert "6000" in caught.value.message and "max_tokens 4096" in caught.value.message
    assert "at least 6000" in caught.value.fix
    with pytest.raises(ConfigError):
        expected_output(EmpiricalLengths((10, 5000), "earlier run"), 4999)


def shape(prompt: list[int], output: list[int], **over: object) -> JobShape:
    base: dict[str, object] = dict(
        prompt_tokens=LengthStats.of(prompt),
        output_tokens=LengthStats.of(output),
        output_from="test",
        is_output_ceiling=False,
        max_tokens=4096,
        samples=1,
        thinking=True,
        shared_prefix_tokens=0.0,
        counted_with="test",
        is_estimate=False,
        records_sampled=len(prompt),
        records_read=len(prompt),
        records_bad=0,
        longest_prompt_tokens=0,
        max_turns=1,
    )
    base.update(over)
    return JobShape(**base)  # type: ignore[arg-type]


def test_derived_figures() -> None:
    job = shape([100, 300], [1000, 3000], shared_prefix_tokens=50.0)
    assert job.context_tokens == 300 + 4096  # the longest prompt and its whole answer
    assert job.kv_tokens_per_request == 200 + 2000  # mean prompt + mean output
    assert job.prefix_share == 0.25
    # a longer record outside the sample decides the context; a conversation makes room for its answers
    assert shape([100], [10], longest_prompt_tokens=900).context_tokens == 900 + 4096
    assert shape([100], [10], max_turns=3).context_tokens == 100 + 3 * 4096
    # an estimated prompt may hold twice the tokens: the context (a hard bound) counts it twice
    estimated = shape([100], [10], longest_prompt_tokens=900, is_estimate=True)
    assert estimated.context_tokens == 2 * 900 + 4096 and estimated.kv_tokens_per_request == 100 + 10


@given(lengths)
def test_length_stats_spread_is_equally_likely_members_in_order(values: list[int]) -> None:
    """The spread: every value where there are few, else 64 of them at evenly spaced ranks; a ceiling's is
    itself; a lognormal's 64 of its quantiles in range."""
    spread = LengthStats.of(values).spread
    assert list(spread) == sorted(spread) and set(spread) <= set(values)
    assert len(spread) == min(len(values), SPREAD_POINTS)
    if len(values) <= SPREAD_POINTS:
        assert list(spread) == sorted(values)
    assert LengthStats.fixed(values[0]).points == (float(values[0]),)


@given(specs())
def test_lognormal_spread_is_its_quantiles_in_range(spec: LogNormalLengths) -> None:
    spread = spec.stats.spread
    assert len(spread) == SPREAD_POINTS and list(spread) == sorted(spread)
    assert spec.min <= spread[0] and spread[-1] <= spec.max


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 500),
    st.lists(st.integers(1, 400), min_size=1, max_size=SPREAD_POINTS),
    st.integers(1, 300),
)
def test_live_kv_is_the_time_average_of_a_batch_that_runs_the_jobs_requests_back_to_back(
    prompt: int, outputs: list[int], page: int
) -> None:
    """A steady batch is slots each running the job's requests one after another, a token a step: the
    pages (⌈tokens / page⌉) and tokens a slot holds, averaged over every step of its requests (a request of
    L tokens is there for L of them), are what `live_pages` and `live_kv_tokens` say a running request
    holds. Counted here step by step: a request that has written w tokens holds prompt + w + 1 pages' worth
    while it writes the next (`live_kv_tokens` takes the middle of that step)."""
    job = shape([prompt], outputs)
    steps = sum(outputs)
    pages = sum(-(-(prompt + w + 1) // page) for n in outputs for w in range(n))
    tokens = sum(prompt + w + 0.5 for n in outputs for w in range(n))
    assert job.live_pages(page) == pytest.approx(pages / steps, rel=1e-9)
    assert job.live_kv_tokens == pytest.approx(tokens / steps, rel=1e-9)
    # part-way through: more than half the shortest request, less than the longest one whole
    assert prompt + min(outputs) / 2 <= job.live_kv_tokens <= prompt + max(outputs)


@settings(max_examples=60, deadline=None)
@given(specs())
def test_a_lognormal_steady_batch_holds_what_its_second_moment_says(spec: LogNormalLengths) -> None:
    """The live KV over a lognormal's spread is E[L²] / 2 E[L] of the truncated distribution (its exact
    moments), within 4 % up to sigma 2 for outputs of 100 tokens and more (the spread is whole tokens): the
    long tail that weighs most is in the spread."""
    assume(spec.sigma <= 2.0 and spec.min >= 100)
    a, b = (math.log(spec.min) - spec.mu) / spec.sigma, (math.log(spec.max) - spec.mu) / spec.sigma
    s = spec.sigma
    second = math.exp(2 * spec.mu + 2 * s * s) * _between(a - 2 * s, b - 2 * s) / _between(a, b)
    job = shape([1], [1], output_tokens=spec.stats)
    assert job.live_kv_tokens - 1 == pytest.approx(second / (2 * spec.mean), rel=0.04)
