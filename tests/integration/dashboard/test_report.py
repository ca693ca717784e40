"""`fleetgen report` on a real job store, opened in headless Chromium; the store reader on a live store.

The store is written through the real `Store` (SQLite WAL, as `fleetgen run` writes it); no engine is
needed because the report reads only the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fleetgen.dashboard import render
from fleetgen.dashboard.chromium import SCALE
from fleetgen.dashboard.jobdata import JobReader
from fleetgen.dashboard.render import error_table
from fleetgen.dashboard.report import read_job
from fleetgen.generate.ledger.store import Batch, ErrorRow, ResultRow, SeriesRow, Store
from tests.fixtures.chromium import dump_dom, need_chromium, png_pixels, screenshot

SECTIONS = (
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
INSTANCES = ("gpu-a-0", "gpu-a-1", "gpu-b-0")
NS = "{http://www.w3.org/2000/svg}"


def result_row(i: int, rnd: random.Random, t0: float) -> ResultRow:
    truncated = i % 17 == 0
    return ResultRow(
        id=f"rec-{i}",
        sample=0,
        khash=i + 1,
        source="in.jsonl",
        line=i + 1,
        prompt="p",
        content="a" * rnd.randint(20, 400),
        reasoning_content="r" * rnd.randint(100, 3000),
        turns="[]",
        num_turns=1,
        finish_reason="length" if truncated else "stop",
        prompt_tokens=50,
        completion_tokens=rnd.randint(50, 900),
        instance=INSTANCES[i % 3],
        model="m",
        params_hash="h",
        attempts=1,
        started_at=t0 + i,
        latency_s=3.0,
        finished_at=t0 + i + 3,
        is_truncated=int(truncated),
        is_empty=0,
        has_leaked_think=0,
        is_repetitive=int(i % 29 == 0),
        chash=i + 1,
    )


def error_row(i: int, t0: float) -> ErrorRow:
    return ErrorRow(
        id=f"bad-{i}",
        sample=0,
        khash=-(i + 1),
        source="in.jsonl",
        line=10_000 + i,
        kind="http_500",
        reason="<b>engine said no</b>",
        status=500,
        attempts=5,
        instance="gpu-b-0",
        finished_at=t0 + i,
        chash=i + 1,
    )


def series_rows(t0: float, steps: range, restart_at: int | None = None) -> list[SeriesRow]:
    """Cumulative counters every 5 s; from `restart_at`, gpu-a-0 counts again from 0 (a resumed run)."""
    rows = []
    for step in steps:
        for k, name in enumerate(INSTANCES):
            n = step - (
                restart_at if restart_at is not None and name == "gpu-a-0" and step >= restart_at else 0
            )
            rows.append(SeriesRow(t0 + 5 * step + k * 0.7, name, 2 * n, 300 * n, 4, 2.4 + 0.1 * k))
    return rows


def fill(out: Path) -> Store:
    rnd, t0 = random.Random(7), 1_700_000_000.0
    store = Store.open(out)
    batch = Batch(
        results=[result_row(i, rnd, t0) for i in range(300)],
        errors=[error_row(i, t0) for i in range(4)],
        series=series_rows(t0, range(60), restart_at=30),
        meta={"params": '{"temperature": 0.6, "max_tokens": 4096}', "input": "in.jsonl"},
    )
    store.write_batch(batch)
    return store


def test_reader_follows_a_store_being_written_without_blocking_it(tmp_path: Path) -> None:
    store = fill(tmp_path)
    reader = JobReader(tmp_path)
    try:
        first = reader.read()
        store.write_batch(
            Batch(
                results=[result_row(i, random.Random(i), 1.7e9) for i in range(300, 320)],
                series=series_rows(1_700_000_000.0, range(60, 62)),
            )
        )
        second = reader.read()
    finally:
        reader.close()
        store.close()
    assert (first.done, first.num_errors, first.num_truncated) == (300, 4, 18)
    assert second.done == 320 and len(second.samples) == len(first.samples) + 6
    a0 = [s.completions for s in second.samples if s.instance == "gpu-a-0"]
    assert a0 == sorted(a0), "a counter restarted by a resumed run must be carried forward, not go back"
    assert first.error_examples[0].message.startswith("<b>engine said no</b>")


@pytest.mark.parametrize(("num_errors", "limit"), [(0, 5), (4, 5), (5, 5), (6, 5), (300, 1), (300, 200)])
def test_reader_lists_at_most_the_asked_errors_newest_first(
    tmp_path: Path, num_errors: int, limit: int
) -> None:
    """The page lists a few errors and the report 200, each saying how many it left out: never them all."""
    t0 = 1_700_000_000.0
    store = Store.open(tmp_path)
    store.write_batch(Batch(errors=[error_row(i, t0) for i in range(num_errors)]))
    store.close()
    reader = JobReader(tmp_path)
    try:
        job = reader.read(num_errors=limit)
    finally:
        reader.close()
    assert job.num_errors == num_errors
    assert [e.record_id for e in job.error_examples] == [f"bad-{i}#0" for i in range(num_errors)][::-1][
        :limit
    ]
    more = num_errors - min(num_errors, limit)
    assert (f"({more:,} more not listed)" in error_table(job.error_examples, job.num_errors)) == (more > 0)


def test_report_opens_in_chromium_with_every_section(tmp_path: Path) -> None:
    need_chromium()
    out = tmp_path / "out"
    fill(out).close()
    db = out / "results.sqlite"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    html = tmp_path / "report.html"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fleetgen.cli import main; main()",
            "report",
            str(out),
            "--to",
            str(html),
            "--png",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before, "the report must not change the store"
    job = read_job(out)
    charts = render.charts(job, ())
    drawn = {f"report-{k.removeprefix('chart-')}.png": ET.fromstring(v) for k, v in charts.items()}
    drawn = {name: root for name, root in drawn.items() if "is-empty" not in root.get("class", "")}
    assert {p.name for p in tmp_path.glob("report-*.png")} == set(drawn), "one PNG per chart that has data"
    for name, root in drawn.items():  # each chart rasterised at its own size (× SCALE), its marks drawn
        width, height, colors = png_pixels(tmp_path / name)
        assert (width, height) == (int(root.get("width", 0)) * SCALE, int(root.get("height", 0)) * SCALE)
        marks = {e.get("fill") for e in root.iter(f"{NS}rect") if e.get("class") == "bar"}
        marks |= {e.get("stroke") for e in root.iter(f"{NS}polyline")}
        assert marks <= colors, (name, marks - colors)

    dom = asyncio.run(dump_dom(html.as_uri(), budget_ms=1000))
    for section in SECTIONS:
        match = re.search(rf'<section id="{section}".*?</section>', dom, re.S)
        assert match, f"section {section} missing"
        assert "is-empty" not in match.group(0), f"section {section} draws an empty chart"
    assert "&lt;b&gt;engine said no&lt;/b&gt;" in dom and "<b>engine said no</b>" not in dom
    assert dom.count('class="instance"') >= len(INSTANCES)
    asyncio.run(screenshot(html.as_uri(), tmp_path / "report-page.png", width=1400, height=2400))
    print(f"report screenshot: {tmp_path / 'report-page.png'}")
