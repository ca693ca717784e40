"""HTML fragments and charts shared by the live page and the report: fleet table, job numbers, examples.

Pure: values in, escaped HTML strings out. The live page swaps these fragments in place every poll; the
report puts the same fragments in one file, so both always agree on what a number means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from fleetgen.dashboard import svg
from fleetgen.dashboard.model import (
    Example,
    InstanceRow,
    JobView,
    Sample,
    by_instance,
    eta_seconds,
    gauge_series,
    rate_series,
    recent_rate,
    sick_reason,
)

DASH = "–"


def fmt(value: float | None, digits: int = 0, suffix: str = "") -> str:
    """A table cell for a number that may be unknown."""
    if value is None:
        return DASH
    return f"{value:,.{digits}f}{suffix}"


def fleet_table(rows: Sequence[InstanceRow]) -> str:
    """The fleet table: one `<tr class="instance">` per instance; sick ones get class `sick` and a reason."""
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "instance",
            "host",
            "GPUs",
            "health",
            "running",
            "queued",
            "gen tok/s",
            "accept len",
            "KV use",
            "capacity plan / actual",
            "drift",
            "uptime",
        )
    )
    body = "".join(_fleet_row(row) for row in rows) or (
        '<tr><td colspan="12" class="muted">no instances: run `fleetgen up` first</td></tr>'
    )
    num_sick = sum(1 for row in rows if sick_reason(row))
    caption = f"{len(rows)} instances, {len(rows) - num_sick} healthy" + (
        f", {num_sick} SICK" if num_sick else ""
    )
    return (
        f'<table id="fleet-table" class="grid"><caption>{escape(caption)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def _fleet_row(row: InstanceRow) -> str:
    reason = sick_reason(row)
    klass = "instance sick" if reason else "instance"
    note = reason or row.problem  # a healthy row may still carry a remark (e.g. no metrics endpoint)
    health = escape(row.readiness.value) + (f'<div class="why">{escape(note)}</div>' if note else "")
    kv = None if row.kv_usage is None else row.kv_usage * 100
    capacity = f"{fmt(row.planned_capacity)} / {fmt(row.actual_capacity)}"
    cells = (
        f'<td class="name">{escape(row.name)}</td><td>{escape(row.host)}</td>'
        f"<td>{escape(','.join(map(str, row.gpus)) or DASH)}</td>"
        f'<td class="health">{health}</td><td class="num">{fmt(row.running)}</td>'
        f'<td class="num">{fmt(row.queued)}</td><td class="num">{fmt(row.gen_tps, 0)}</td>'
        f'<td class="num">{fmt(row.accept_len, 2)}</td><td class="num">{fmt(kv, 0, "%")}</td>'
        f'<td class="num">{escape(capacity)}</td><td>{escape(row.drift) or DASH}</td>'
        f'<td class="num">{svg.format_duration(row.uptime_s) if row.uptime_s is not None else DASH}</td>'
    )
    data = f'data-instance="{escape(row.name)}" data-health="{escape(row.readiness.value)}"'
    return f'<tr class="{klass}" {data}>{cells}</tr>'


def summary_numbers(job: JobView) -> dict[str, str]:
    """The headline numbers by element id: done/total, percent, ETA, rates, errors, truncations."""
    eta = eta_seconds(job)
    completions = recent_rate(job.samples, "completions")
    tokens = recent_rate(job.samples, "output_tokens")
    total = job.total
    percent = (100.0 * (job.done + job.num_errors) / total) if total else None
    eta_text = DASH if eta is None else svg.format_duration(eta)
    if job.is_finished:
        eta_text = "finished"
    return {
        "done": f"{job.done:,}",
        "total": DASH if total is None else f"{total:,}",
        "percent": fmt(percent, 1, "%"),
        "eta": eta_text,
        "completions-rate": fmt(completions, 2),
        "tokens-rate": fmt(tokens, 0),
        "errors": f"{job.num_errors:,}",
        "truncated": f"{job.num_truncated:,}",
        "elapsed": svg.format_duration((job.updated_at or 0) - (job.started_at or 0))
        if job.started_at
        else DASH,
    }


def summary_cards(numbers: Mapping[str, str]) -> str:
    """The headline numbers as cards; each value carries its id so the live page can update it."""
    cards = (
        (
            "done",
            "done",
            f'<span id="done">{numbers["done"]}</span> / <span id="total">{numbers["total"]}</span>',
        ),
        ("percent", "progress", f'<span id="percent">{numbers["percent"]}</span>'),
        ("eta", "ETA", f'<span id="eta">{numbers["eta"]}</span>'),
        ("rate", "completions/s", f'<span id="completions-rate">{numbers["completions-rate"]}</span>'),
        ("tokens", "output tok/s", f'<span id="tokens-rate">{numbers["tokens-rate"]}</span>'),
        ("errors", "errors", f'<span id="errors">{numbers["errors"]}</span>'),
        ("truncated", "truncated", f'<span id="truncated">{numbers["truncated"]}</span>'),
        ("elapsed", "elapsed", f'<span id="elapsed">{numbers["elapsed"]}</span>'),
    )
    bad = {"errors": numbers["errors"] != "0", "truncated": numbers["truncated"] != "0"}
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card{" warn" if bad.get(key) else ""}" data-card="{key}">'
            f'<div class="label">{label}</div>'
            f'<div class="value">{value}</div></div>'
            for key, label, value in cards
        )
        + "</div>"
    )


def progress_bar(job: JobView) -> str:
    """A bar split into done (green) and errors (red) out of the total."""
    if job.total is None:  # a full bar would claim the job is finished
        return '<div id="progress" class="progress" title="total not known yet"></div>'
    total = max(job.total, 1)
    done, errs = 100.0 * job.done / total, 100.0 * job.num_errors / total
    return (
        f'<div id="progress" class="progress" title="{job.done} done, {job.num_errors} errors of {total}">'
        f'<div class="ok" style="width:{done:.2f}%"></div>'
        f'<div class="bad" style="width:{errs:.2f}%"></div></div>'
    )


def examples(job: JobView, *, with_errors: bool = True) -> str:
    """Errors by kind (and a few examples unless `with_errors` is off), a few truncations, side by side."""
    kinds = "".join(f"<li><b>{n:,}</b> {escape(kind)}</li>" for kind, n in _top(job.error_kinds))
    listed = _example_list(job.error_examples, "error-examples") if with_errors and job.error_examples else ""
    return (
        '<div class="examples"><div><h3>errors by kind</h3>'
        f'<ul class="kinds">{kinds or "<li class=muted>none</li>"}</ul>{listed}</div>'
        f"<div><h3>truncations (finish_reason = length)</h3>"
        f"{_example_list(job.truncation_examples, 'truncation-examples')}</div></div>"
    )


def _example_list(items: Sequence[Example], element_id: str) -> str:
    if not items:
        return f'<ul id="{element_id}" class="ex"><li class="muted">none</li></ul>'
    rows = "".join(
        f'<li><code>{escape(e.record_id)}</code> <span class="muted">{escape(e.instance)}</span> '
        f"{escape(e.message[:300])}</li>"
        for e in items
    )
    return f'<ul id="{element_id}" class="ex">{rows}</ul>'


def _top(counts: Mapping[str, int], limit: int = 12) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]


def count_bars(
    counts: Mapping[str, int], *, title: str, klass: str, width: int, red: frozenset[str] = frozenset()
) -> str:
    """A bar per key of `counts` (largest first); keys in `red` draw red."""
    bars = [svg.Bar(k, float(v), svg.SICK_COLOR if k in red else "") for k, v in _top(counts)]
    return svg.bar_chart(bars, title=title, klass=klass, width=width)


def _rate_charts(job: JobView, attr: str, label: str, width: int) -> dict[str, str]:
    """Two charts of one rate: the fleet total alone (its scale), and one line per instance (theirs)."""
    series = rate_series(job.samples, attr)
    per_instance, total = series[:-1], series[-1:]
    key = "tokens" if attr == "output_tokens" else "completions"
    return {
        f"chart-{key}-total": svg.line_chart(
            total, title=f"{label}, fleet total", width=width, klass=f"{key}-total"
        ),
        f"chart-{key}": svg.line_chart(per_instance, title=f"{label} per instance", width=width, klass=key),
    }


def charts(
    job: JobView, rows: Sequence[InstanceRow], width: int = 640, live: Sequence[Sample] = ()
) -> dict[str, str]:
    """Every chart over time (and capacity) by element id, as SVG strings. Accept length comes from the
    store's series when `run` recorded it, else from `live` (what the dashboard scraped while open)."""
    recorded = any(s.accept_len is not None for s in job.samples)
    accept = gauge_series(job.samples if recorded else live, "accept_len")
    scraped_here = not recorded and bool(live)  # the report has no `live`: it never claims a page was open
    capacity = [
        (
            r.name,
            r.planned_capacity,
            r.actual_capacity,
            r.planned_capacity is not None and (r.actual_capacity or 0.0) < r.planned_capacity,
        )
        for r in rows
        if r.planned_capacity is not None or r.actual_capacity is not None
    ]
    return {
        **_rate_charts(job, "output_tokens", "output tok/s", width),
        **_rate_charts(job, "completions", "completions/s", width),
        "chart-accept": svg.line_chart(
            accept,
            title="speculative accept length" + (" (since the page opened)" if scraped_here else ""),
            width=width,
            y_min=None,
            empty_text="no speculative decoding metrics",
            klass="accept",
        ),
        "chart-capacity": svg.paired_bars(
            capacity,
            title="capacity: planned vs actual (max running requests)",
            labels=("planned", "actual"),
            width=width,
            klass="capacity",
        ),
    }


def result_charts(job: JobView, width: int = 640) -> dict[str, str]:
    """Charts over finished results: length histograms, finish reasons, quality flags, error kinds."""
    lengths = (("reasoning", job.reasoning_tokens), ("answer", job.answer_tokens))
    return {
        "chart-lengths": svg.histogram(
            lengths, title="output length (tokens; reasoning share estimated)", width=width, klass="lengths"
        ),
        "chart-finish": count_bars(
            job.finish_reasons,
            title="finish reasons",
            klass="finish",
            width=width,
            red=frozenset({"length", "abort", "error"}),
        ),
        "chart-quality": count_bars(job.quality_flags, title="quality flags", klass="quality", width=width),
        "chart-errors": count_bars(
            job.error_kinds,
            title="errors by kind",
            klass="errors",
            width=width,
            red=frozenset(job.error_kinds),
        ),
    }


def error_table(items: Sequence[Example], num_errors: int) -> str:
    """Every listed error as a table row (record, instance, kind, message); says how many are not listed."""
    if not items:
        return '<p class="muted">no errors</p>'
    body = "".join(
        f"<tr><td><code>{escape(e.record_id)}</code></td><td>{escape(e.instance)}</td>"
        f"<td>{escape(e.kind)}</td><td>{escape(e.message[:500])}</td></tr>"
        for e in items
    )
    more = num_errors - len(items)
    caption = f"{num_errors:,} errors" + (f" ({more:,} more not listed)" if more > 0 else "")
    return (
        f'<table id="error-table" class="grid"><caption>{caption}</caption><thead><tr><th>record</th>'
        f"<th>instance</th><th>kind</th><th>message</th></tr></thead><tbody>{body}</tbody></table>"
    )


def instance_summary(job: JobView) -> str:
    """Per instance over the whole job, from the recorded time series: work done and mean gauges."""
    rows = []
    for name, samples in by_instance(job.samples).items():
        last = samples[-1]
        active_s = last.ts - samples[0].ts
        accept = [s.accept_len for s in samples if s.accept_len is not None]
        rows.append(
            f'<tr class="instance"><td class="name">{escape(name)}</td><td class="num">{len(samples):,}</td>'
            f'<td class="num">{last.completions:,}</td><td class="num">{last.output_tokens:,}</td>'
            f'<td class="num">{fmt(last.output_tokens / active_s if active_s > 0 else None)}</td>'
            f'<td class="num">{fmt(sum(accept) / len(accept) if accept else None, 2)}</td>'
            f'<td class="num">{svg.format_duration(active_s)}</td></tr>'
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "instance",
            "samples",
            "completions",
            "output tokens",
            "mean output tok/s",
            "mean accept len",
            "active",
        )
    )
    body = "".join(rows) or '<tr><td colspan="7" class="muted">no time series recorded</td></tr>'
    return (
        f'<table id="instance-summary" class="grid"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )
