"""Whole pages: the live dashboard (first paint + the JSON each poll returns) and the self-contained report.

Templates are static files filled with `string.Template`: `static/page.html` is both pages' shell, `live.html`
and `report.html` their bodies; every value put in them is already escaped by `render`. The report inlines the
CSS, so one file is the whole report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from functools import cache
from html import escape
from importlib import resources
from string import Template
from typing import Any

from fleetgen.dashboard import render
from fleetgen.dashboard.model import InstanceRow, JobView, Sample, sick_reason

STATIC = resources.files("fleetgen.dashboard").joinpath("static")  # templates, CSS and script, shipped


@cache
def asset(name: str) -> str:
    """The text of a file in `STATIC`."""
    return STATIC.joinpath(name).read_text(encoding="utf-8")


def state(job: JobView, rows: Sequence[InstanceRow], live: Sequence[Sample] = ()) -> dict[str, Any]:
    """What one poll returns: numbers by element id, HTML fragments by element id, card warnings, title."""
    numbers = render.summary_numbers(job)
    sick = {r.instance: sick_reason(r) for r in rows}
    num_sick = sum(map(bool, sick.values()))
    flagged = f" · {num_sick} SICK" if num_sick else ""
    return {
        "numbers": numbers,
        "fragments": {
            "fleet": render.fleet_table(rows),
            "progress-wrap": render.progress_bar(job),
            "examples": render.examples(job),
            **render.charts(job, rows, live=live),
        },
        "warn": {"errors": job.num_errors > 0, "truncated": job.num_truncated > 0},
        "title": f"{numbers['percent']} · {numbers['done']}/{numbers['total']}{flagged} · fleetgen",
        "instances": [
            {"name": r.instance, "health": r.readiness.value, "sick": sick[r.instance]} for r in rows
        ],
    }


def _page(title: str, style: str, body: str, **values: str) -> str:
    """The shell `page.html` around the body template `body` filled with `values`."""
    filled = Template(asset(body)).substitute(values)
    return Template(asset("page.html")).substitute(title=escape(title), style=style, body=filled)


def _by_name(fragments: Mapping[str, str]) -> dict[str, str]:
    """Fragments by element id, named as the templates name them (`chart-accept` → `$chart_accept`)."""
    return {key.replace("-", "_"): value for key, value in fragments.items()}


def dashboard_page(current: Mapping[str, Any], subtitle: str) -> str:
    """The live page with `current` (a `state()`, with the server's notice) already in it, each fragment in
    the element of its id; the script then keeps it current."""
    return _page(
        current["title"],
        '<link rel="stylesheet" href="static/dashboard.css">',
        "live.html",
        subtitle=escape(subtitle),
        cards=render.summary_cards(current["numbers"]),
        **_by_name(current["fragments"]),
    )


def report_page(job: JobView) -> str:
    """One self-contained HTML file: inline CSS and SVG, no script, no external reference. Its instance
    table is what the job's time series recorded (a report reads no fleet)."""
    return _page(
        f"fleetgen report · {job.out_dir}",
        f"<style>\n{asset('dashboard.css')}\n</style>",
        "report.html",
        subtitle=escape(f"{job.out_dir} · {'finished' if job.is_finished else 'running'}"),
        generated=escape(time.strftime("%Y-%m-%d %H:%M:%S")),
        cards=render.summary_cards(render.summary_numbers(job)),
        progress=render.progress_bar(job),
        error_table=render.error_table(job.error_examples, job.num_errors),
        examples=render.examples(job, with_errors=False),
        fleet_table=render.instance_summary(job),
        meta=meta_list(job.meta),
        **_by_name(render.charts(job, ())),
    )


def meta_list(meta: Mapping[str, object]) -> str:
    """The job's recorded settings (fleet, engine flags, sampling params) as a definition list."""
    if not meta:
        return '<p class="muted">the store holds no settings for this job</p>'
    items = []
    for key, value in sorted(meta.items()):
        text = (
            json.dumps(value, indent=2, sort_keys=True, default=str)
            if isinstance(value, dict | list)
            else str(value)
        )
        shown = f"<pre class='meta'>{escape(text)}</pre>" if "\n" in text else escape(text)
        items.append(f"<dt>{escape(key)}</dt><dd>{shown}</dd>")
    return f'<dl id="meta" class="kv">{"".join(items)}</dl>'
