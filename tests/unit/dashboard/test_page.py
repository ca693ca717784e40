"""`dashboard.page`: the report's whole page has every section and references nothing outside it."""

from __future__ import annotations

import re

from fleetgen.dashboard import page
from fleetgen.dashboard.model import Example
from tests.unit.dashboard._helpers import job_with, linear_samples

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
