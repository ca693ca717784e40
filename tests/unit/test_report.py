"""The report's pure parts: chart arithmetic, rates and ETA from samples, and the HTML it assembles."""

from __future__ import annotations

import re

import pytest

from fleetgen.dashboard import page, render
from fleetgen.dashboard.model import Example, InstanceRow, JobView, Sample, eta_seconds, rate_series
from fleetgen.deploy.readiness import Readiness

REPORT_SECTIONS = (
    "summary",
    "throughput",
    "accept",
    "lengths",
    "finish-reasons",
    "quality",
    "errors",
    "fleet",
    "flags",
)


def linear_samples(
    rates: dict[str, float], seconds: int, step: float = 5.0, offset: float = 0.0
) -> list[Sample]:
    """Cumulative counters growing at a constant rate per instance, sampled every `step` seconds."""
    return [
        Sample(
            ts=1000.0 + t * step + offset * k,
            instance=name,
            completions=int(rate * t * step),
            output_tokens=int(100 * rate * t * step),
            accept_len=2.5,
        )
        for k, (name, rate) in enumerate(rates.items())
        for t in range(int(seconds / step) + 1)
    ]


def job_with(samples: list[Sample], **fields: object) -> JobView:
    base: dict[str, object] = dict(
        out_dir="/data/job", total=1000, done=400, num_errors=3, num_truncated=2, samples=tuple(samples)
    )
    base.update(fields)
    return JobView(**base)  # type: ignore[arg-type]


def test_rates_recover_each_instance_slope_and_their_sum() -> None:
    samples = linear_samples({"a-0": 2.0, "b-0": 0.4}, seconds=600, offset=1.3)  # whole counts per sample
    series = {s.name: s for s in rate_series(samples, "completions")}
    assert set(series) == {"a-0", "b-0", "total"} and series["total"].is_total
    middle = slice(3, -3)  # the edges of the window see only one instance's samples
    for name, rate in (("a-0", 2.0), ("b-0", 0.4), ("total", 2.4)):
        values = [y for _, y in series[name].points][middle]
        assert all(abs(v - rate) < 0.05 * rate for v in values), (name, values)


def test_eta_is_remaining_work_over_the_recent_rate() -> None:
    job = job_with(linear_samples({"a-0": 2.0}, seconds=600), total=1000, done=400, num_errors=0)
    eta = eta_seconds(job)
    assert eta is not None and abs(eta - 600 / 2.0) < 5
    assert eta_seconds(job_with([], total=None)) is None


def test_sick_rows_are_marked_with_their_reason() -> None:
    rows = [
        InstanceRow("h-0", "h", (0,), 30000, readiness=Readiness.READY, gen_tokens_per_s=900.0),
        InstanceRow("h-1", "h", (1,), 30001, readiness=Readiness.DOWN, problem="not running"),
    ]
    html = render.fleet_table(rows)
    sick = re.findall(r'<tr class="instance sick"[^>]*data-instance="([^"]+)"', html)
    assert sick == ["h-1"] and "not running" in html and "1 SICK" in html


@pytest.mark.parametrize(
    ("running", "queued", "admitted", "is_starved"),
    [(10, 0, 256, True), (204, 0, 256, True), (205, 0, 256, False), (10, 3, 256, False), (0, 0, 256, False)],
)
def test_a_batch_the_job_does_not_keep_full_shows_as_starved(
    running: int, queued: int, admitted: int, is_starved: bool
) -> None:
    """Running under 80 % of what the engine admits with nothing waiting: a note on the row (the server is
    healthy: not red), running shown beside admitted; an idle server (no job) is not starved."""
    row = InstanceRow(
        "h-0",
        "h",
        (0,),
        30000,
        readiness=Readiness.READY,
        running=running,
        queued=queued,
        max_running_requests=admitted,
    )
    html = render.fleet_table([row])
    assert ("starved" in html) is is_starved and 'class="instance sick"' not in html
    assert f">{running} / {admitted}<" in html


def test_report_has_every_section_and_no_external_reference() -> None:
    samples = linear_samples({"a-0": 2.0, "b-0": 1.0}, seconds=300)
    job = job_with(
        samples,
        reasoning_tokens=(900, 1200, 40),
        answer_tokens=(100, 300, 20),
        finish_reasons={"stop": 398, "length": 2},
        quality_flags={"truncated": 2, "repetitive": 1},
        error_kinds={"http_500": 3},
        meta={"params": {"temperature": 0.6}, "input": "in.jsonl"},
        error_examples=(Example("<script>alert(1)</script>#0", "a-0", "HTTP 500 </td>", "http_500"),),
    )
    html = page.report_page(job)
    for section in REPORT_SECTIONS:
        assert f'<section id="{section}"' in html, section
    assert "<script" not in html.replace("&lt;script&gt;", ""), "the report must be inert and escape input"
    assert not re.search(r'(src|href)="(https?:)?//', html), "the report must not load anything"
    assert html.count("<svg") >= 8 and "temperature" in html and "http_500" in html


def test_unknown_total_draws_no_full_progress_bar() -> None:
    html = render.progress_bar(job_with([], total=None))
    assert 'class="ok"' not in html
