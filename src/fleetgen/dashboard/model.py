"""What the dashboard and the report show, as plain values, and the arithmetic over them.

Readers (`jobdata`, `fleetdata`) fill these from the job store and the fleet status; `render` draws them.
Pure: rates, ETA and downsampling are functions of the samples, so they are unit-tested without a fleet.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetgen.dashboard.svg import Series
from fleetgen.deploy.readiness import Readiness
from fleetgen.fleet.status import InstanceStatus

MAX_POINTS = 120  # a chart over days keeps this many buckets: enough to see dips, light to ship every 1.5 s


@dataclass
class InstanceRow(InstanceStatus):
    """One row of the fleet table: the instance's status (None = not known) and the plan's capacity."""

    planned_max_running_requests: int | None = None


@dataclass(frozen=True)
class Sample:
    """One time-series point of one instance, as `run` records it every few seconds.

    `completions` and `output_tokens` are cumulative counts for the job; `accept_len` as scraped then.
    """

    ts: float
    instance: str
    completions: int = 0
    output_tokens: int = 0
    accept_len: float | None = None


@dataclass(frozen=True)
class Example:
    """One error or truncation shown as an example: which record, what happened."""

    record_id: str
    instance: str
    message: str
    kind: str = ""


@dataclass(frozen=True)
class JobView:
    """Everything about one job the pages show; `started_at` and `updated_at` are unix seconds."""

    out_dir: str
    total: int | None = None
    done: int = 0
    num_errors: int = 0
    num_truncated: int = 0
    started_at: float | None = None
    updated_at: float | None = None
    is_finished: bool = False
    error_examples: tuple[Example, ...] = ()
    truncation_examples: tuple[Example, ...] = ()
    error_kinds: Mapping[str, int] = field(default_factory=dict)
    finish_reasons: Mapping[str, int] = field(default_factory=dict)
    quality_flags: Mapping[str, int] = field(default_factory=dict)
    reasoning_tokens: tuple[int, ...] = ()
    answer_tokens: tuple[int, ...] = ()
    samples: tuple[Sample, ...] = ()
    meta: Mapping[str, object] = field(default_factory=dict)


def bucket_edges(start: float, end: float, min_width: float = 2.0) -> list[float]:
    """Equal-width bucket edges over [start, end]: at most `MAX_POINTS` buckets, each ≥ `min_width` s."""
    span = max(end - start, 0.0)
    width = max(span / MAX_POINTS, min_width)
    count = max(int(span // width), 1)
    return [start + k * width for k in range(count + 1)]


def _value_at(times: Sequence[float], values: Sequence[int], at: float) -> float:
    """A cumulative count at `at`, interpolated between the two samples around it (flat outside them).

    Interpolating (rather than taking the last sample) keeps a bucket that happens to hold no sample
    from showing as a false drop to zero followed by a false doubling.
    """
    index = bisect.bisect_right(times, at)
    if index == 0:
        return float(values[0])
    if index == len(times):
        return float(values[-1])
    t0, t1, v0, v1 = times[index - 1], times[index], values[index - 1], values[index]
    return v0 + (v1 - v0) * (at - t0) / (t1 - t0)


def by_instance(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """Samples grouped per instance, each list in time order; instances in name order."""
    grouped: dict[str, list[Sample]] = {}
    for sample in sorted(samples, key=lambda s: (s.instance, s.ts)):
        grouped.setdefault(sample.instance, []).append(sample)
    return grouped


def sample_interval(grouped: Mapping[str, Sequence[Sample]]) -> float:
    """The typical seconds between two samples of one instance (median; 2 s when unknown).

    A bucket narrower than that holds no sample at all and would draw the rate as a saw of zeros.
    """
    gaps = sorted(b.ts - a.ts for rows in grouped.values() for a, b in itertools.pairwise(rows))
    return max(gaps[len(gaps) // 2], 2.0) if gaps else 2.0


def rate_series(samples: Sequence[Sample], attr: str) -> list[Series]:
    """Per-instance rate (per second) of a cumulative counter (`completions` or `output_tokens`), and a
    last series `total` (`is_total`): counts are read at shared bucket edges, so instances sampled at
    different moments add up."""
    if len(samples) < 2:
        return []
    grouped = by_instance(samples)
    edges = bucket_edges(min(s.ts for s in samples), max(s.ts for s in samples), sample_interval(grouped))
    series, totals = [], [0.0] * (len(edges) - 1)
    for name, rows in grouped.items():
        times, counts = [r.ts for r in rows], [int(getattr(r, attr)) for r in rows]
        at_edges = [_value_at(times, counts, edge) for edge in edges]
        rates = [(at_edges[k + 1] - at_edges[k]) / (edges[k + 1] - edges[k]) for k in range(len(edges) - 1)]
        totals = [a + b for a, b in zip(totals, rates, strict=True)]
        series.append(Series(name, [(edges[k + 1], rate) for k, rate in enumerate(rates)]))
    series.append(Series("total", [(edges[k + 1], r) for k, r in enumerate(totals)], is_total=True))
    return series


def gauge_series(samples: Sequence[Sample], attr: str) -> list[Series]:
    """Per-instance line of a gauge (`accept_len`): the mean of the samples in each bucket."""
    present = [s for s in samples if getattr(s, attr) is not None]
    if not present:
        return []
    edges = bucket_edges(min(s.ts for s in present), max(s.ts for s in present))
    series = []
    for name, rows in by_instance(present).items():
        buckets: dict[int, list[float]] = {}
        for row in rows:
            index = min(bisect.bisect_right(edges, row.ts) - 1, len(edges) - 2)  # edges[0] is the first ts
            buckets.setdefault(index, []).append(float(getattr(row, attr)))
        points = [(edges[k], sum(v) / len(v)) for k, v in sorted(buckets.items())]
        series.append(Series(name, points))
    return series


def recent_rate(samples: Sequence[Sample], attr: str, window_s: float = 60.0) -> float | None:
    """Fleet-wide rate (per second) of a cumulative counter over the last `window_s` seconds of samples."""
    total = 0.0
    seen = False
    for rows in by_instance(samples).values():
        end = rows[-1]
        start = next((r for r in rows if r.ts >= end.ts - window_s), rows[0])
        if end.ts > start.ts:
            total += (getattr(end, attr) - getattr(start, attr)) / (end.ts - start.ts)
            seen = True
    return total if seen else None


def eta_seconds(job: JobView, window_s: float = 300.0) -> float | None:
    """Seconds left at the recent completion rate; None when the total or the rate is unknown."""
    if job.total is None:
        return None
    remaining = max(job.total - job.done - job.num_errors, 0)
    if remaining == 0:
        return 0.0
    rate = recent_rate(job.samples, "completions", window_s)
    return remaining / rate if rate else None


def sick_reason(row: InstanceRow) -> str:
    """Why a fleet row should stand out in red ("" when it is fine)."""
    if row.readiness is not Readiness.READY:
        return row.problem or row.readiness.value
    if row.drift:
        return f"drift: {'; '.join(row.drift)}"
    return ""


STARVED_SHARE = 0.8  # running under this share of what the engine admits, with nothing queued: starved
FULL_KV = 0.9  # an engine whose figure is a floor (vLLM's) runs more until its KV pool is this full


def starved(row: InstanceRow) -> str:
    """A batch the job does not keep full: fewer running than the engine admits and no request waiting (the
    server decodes fewer tokens per step than it could; give it more in flight, or more servers less). Where
    the engine's figure is a floor it runs past (vLLM without max-num-seqs), its KV pool says instead."""
    admitted, running, queued = row.max_running_requests, row.running, row.queued
    if not admitted or running is None or queued is None or running == 0 or queued:
        return ""  # idle (no job), not known, or requests waiting: nothing to say
    if row.running_is_floor:
        if row.kv_usage is not None and row.kv_usage < FULL_KV:
            return f"starved: {running:.0f} running, none queued, its KV pool {row.kv_usage:.0%} used"
        return ""
    if running < STARVED_SHARE * admitted:
        return f"starved: {running:.0f} running of {admitted} admitted, none queued"
    return ""
