"""HTML fragments and charts of the live page and the report: job numbers, examples, tables (the live fleet,
the report's errors and instances).

Pure: values in, escaped HTML strings out. The live page swaps these fragments in place every poll; the
report puts the same fragments in one file, so both always agree on what a number means.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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
    starved,
)

DASH = "–"


def fmt(value: float | None, digits: int = 0, suffix: str = "") -> str:
    """A table cell for a number that may be unknown."""
    return DASH if value is None else f"{value:,.{digits}f}{suffix}"


def fmt_duration(seconds: float | None) -> str:
    return DASH if seconds is None else svg.format_duration(seconds)


def _table(element_id: str, columns: str, rows: str, *, empty: str, caption: str = "") -> str:
    """A `<table class="grid">`: `columns` separated by "|", the rows' HTML (else one row saying `empty`)."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns.split("|"))
    rows = rows or f'<tr><td colspan="{columns.count("|") + 1}" class="muted">{escape(empty)}</td></tr>'
    caption = f"<caption>{escape(caption)}</caption>" if caption else ""
    head = f"{caption}<thead><tr>{head}</tr></thead>"
    return f'<table id="{element_id}" class="grid">{head}<tbody>{rows}</tbody></table>'


def fleet_table(rows: Sequence[InstanceRow]) -> str:
    """The fleet table: one `<tr class="instance">` per instance; sick ones get class `sick` and a reason."""
    num_sick = sum(1 for row in rows if sick_reason(row))
    caption = f"{len(rows)} instances, {len(rows) - num_sick} healthy" + (
        f", {num_sick} SICK" if num_sick else ""
    )
    return _table(
        "fleet-table",
        "instance|host|GPUs|health|running / admitted|queued|gen tok/s|accept len|KV use"
        "|capacity plan / actual|drift|uptime",
        "".join(_fleet_row(row) for row in rows),
        empty="no instances: run `fleetgen up` first",
        caption=caption,
    )


def _fleet_row(row: InstanceRow) -> str:
    reason = sick_reason(row)
    klass = "instance sick" if reason else "instance"
    # a healthy row may still carry a remark (no metrics endpoint; a batch the job does not keep full)
    note = reason or row.problem or starved(row)
    health = escape(row.readiness.value) + (f'<div class="why">{escape(note)}</div>' if note else "")
    kv = None if row.kv_usage is None else row.kv_usage * 100
    capacity = f"{fmt(row.planned_max_running_requests)} / {fmt(row.max_running_requests)}"
    cells = (
        f'<td class="name">{escape(row.instance)}</td><td>{escape(row.host)}</td>'
        f"<td>{escape(','.join(map(str, row.gpus)) or DASH)}</td>"
        f'<td class="health">{health}</td>'
        f'<td class="num">{fmt(row.running)} / {"≥" if row.running_is_floor else ""}'
        f"{fmt(row.max_running_requests)}</td>"
        f'<td class="num">{fmt(row.queued)}</td><td class="num">{fmt(row.gen_tokens_per_s, 0)}</td>'
        f'<td class="num">{fmt(row.spec_accept_length, 2)}</td><td class="num">{fmt(kv, 0, "%")}</td>'
        f'<td class="num">{escape(capacity)}</td><td>{escape("; ".join(row.drift)) or DASH}</td>'
        f'<td class="num">{fmt_duration(row.uptime_s)}</td>'
    )
    data = f'data-instance="{escape(row.instance)}" data-health="{escape(row.readiness.value)}"'
    return f'<tr class="{klass}" {data}>{cells}</tr>'


def summary_numbers(job: JobView) -> dict[str, str]:
    """The headline numbers by element id: done/total, percent, ETA, rates, errors, truncations."""
    total, eta = job.total, eta_seconds(job)
    percent = (100.0 * (job.done + job.num_errors) / total) if total else None
    elapsed = (job.updated_at or 0) - job.started_at if job.started_at else None
    return {
        "done": f"{job.done:,}",
        "total": DASH if total is None else f"{total:,}",
        "percent": fmt(percent, 1, "%"),
        "eta": "finished" if job.is_finished else fmt_duration(eta),
        "completions-rate": fmt(recent_rate(job.samples, "completions"), 2),
        "tokens-rate": fmt(recent_rate(job.samples, "output_tokens"), 0),
        "errors": f"{job.num_errors:,}",
        "truncated": f"{job.num_truncated:,}",
        "elapsed": fmt_duration(elapsed),
    }


CARDS = (  # (card, label, the ids of the numbers it shows)
    ("done", "done", ("done", "total")),
    ("percent", "progress", ("percent",)),
    ("eta", "ETA", ("eta",)),
    ("rate", "completions/s", ("completions-rate",)),
    ("tokens", "output tok/s", ("tokens-rate",)),
    ("errors", "errors", ("errors",)),
    ("truncated", "truncated", ("truncated",)),
    ("elapsed", "elapsed", ("elapsed",)),
)


def summary_cards(numbers: Mapping[str, str]) -> str:
    """The headline numbers as cards; each value carries its id so the live page can update it."""
    cards = []
    for card, label, ids in CARDS:
        is_bad = card in ("errors", "truncated") and numbers[card] != "0"
        value = " / ".join(f'<span id="{i}">{numbers[i]}</span>' for i in ids)
        cards.append(
            f'<div class="card{" warn" if is_bad else ""}" data-card="{card}">'
            f'<div class="label">{label}</div><div class="value">{value}</div></div>'
        )
    return f'<div class="cards">{"".join(cards)}</div>'


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


def count_bars(counts: Mapping[str, int], *, title: str, red: Collection[str] = ()) -> str:
    """A bar per key of `counts` (largest first); keys in `red` draw red."""
    bars = [svg.Bar(k, float(v), svg.SICK_COLOR if k in red else "") for k, v in _top(counts)]
    return svg.bar_chart(bars, title=title)


def _rate_charts(job: JobView, attr: str, key: str, label: str) -> dict[str, str]:
    """Two charts of one rate: the fleet total alone (its scale), and one line per instance (theirs)."""
    series = rate_series(job.samples, attr)  # one per instance, then the total
    return {
        f"chart-{key}-total": svg.line_chart(series[-1:], title=f"{label}, fleet total"),
        f"chart-{key}": svg.line_chart(series[:-1], title=f"{label} per instance"),
    }


def _capacity_bars(row: InstanceRow) -> list[svg.Bar]:
    """Planned (grey) and actual max running requests of an instance; actual red when short of the plan."""
    actual = row.max_running_requests
    is_short = (
        row.planned_max_running_requests is not None and (actual or 0) < row.planned_max_running_requests
    )
    return [
        svg.Bar(f"{row.instance} planned", row.planned_max_running_requests, svg.GREY),
        svg.Bar(f"{row.instance} actual", actual, svg.SICK_COLOR if is_short else svg.PALETTE[0]),
    ]


def charts(job: JobView, rows: Sequence[InstanceRow], live: Sequence[Sample] = ()) -> dict[str, str]:
    """Every chart by element id, as SVG strings: rates over time, accept length, capacity, and over the
    finished results: lengths, finish reasons, quality flags, error kinds. Accept length comes from the
    store's series when `run` recorded it, else from `live` (what the dashboard scraped while open)."""
    recorded = any(s.accept_len is not None for s in job.samples)
    scraped_here = not recorded and bool(live)  # the report has no `live`: it never claims a page was open
    capacity = [
        bar
        for r in rows
        if r.planned_max_running_requests is not None or r.max_running_requests is not None
        for bar in _capacity_bars(r)
    ]
    lengths = (("reasoning", job.reasoning_tokens), ("answer", job.answer_tokens))
    return {
        **_rate_charts(job, "output_tokens", "tokens", "output tok/s"),
        **_rate_charts(job, "completions", "completions", "completions/s"),
        "chart-accept": svg.line_chart(
            gauge_series(job.samples if recorded else live, "accept_len"),
            title="speculative accept length" + (" (since the page opened)" if scraped_here else ""),
            y_min=None,
            empty_text="no speculative decoding metrics",
        ),
        "chart-capacity": svg.bar_chart(
            capacity,
            title="capacity: planned vs actual (max running requests)",
            empty_text="no plan or no metrics yet",
        ),
        "chart-lengths": svg.histogram(lengths, title="output length (tokens; reasoning share estimated)"),
        "chart-finish": count_bars(
            job.finish_reasons, title="finish reasons", red=("length", "abort", "error")
        ),
        "chart-quality": count_bars(job.quality_flags, title="quality flags"),
        "chart-errors": count_bars(job.error_kinds, title="errors by kind", red=job.error_kinds),
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
    return _table("error-table", "record|instance|kind|message", body, empty="", caption=caption)


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
    return _table(
        "instance-summary",
        "instance|samples|completions|output tokens|mean output tok/s|mean accept len|active",
        "".join(rows),
        empty="no time series recorded",
    )
