"""Server-rendered SVG charts: line charts over time, histograms, horizontal and grouped bars.

Pure functions from numbers to an `<svg>` string, so the live page and the self-contained report draw the
same pictures without shipping a JavaScript chart library. Every text is escaped; an empty input draws an
empty frame that says so (a chart that silently draws nothing looks like a broken page).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#2563eb",
    "#16a34a",
    "#d97706",
    "#9333ea",
    "#0891b2",
    "#db2777",
    "#65a30d",
    "#7c3aed",
    "#0d9488",
    "#ea580c",
    "#4f46e5",
    "#ca8a04",
)
TOTAL_COLOR = "#111827"
SICK_COLOR = "#dc2626"
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_MARGIN_L, _MARGIN_R, _MARGIN_T, _MARGIN_B = 52, 12, 26, 30


@dataclass(frozen=True)
class Series:
    """One line: `points` are (x, y); x is seconds for time charts."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str = ""
    is_total: bool = False


@dataclass(frozen=True)
class Bar:
    """One horizontal bar: a label, a value, an optional colour and note shown after the value."""

    label: str
    value: float
    color: str = ""
    note: str = ""


def color_for(index: int) -> str:
    """The palette colour of series number `index` (cycles)."""
    return PALETTE[index % len(PALETTE)]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [low, high] (steps of 1, 2, 2.5 or 5 × 10^k)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high - low <= 1e-9 * max(abs(low), 1.0):  # a flat line still gets an axis around it
        high = low + max(abs(low), 1.0)
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    digits = max(0, 2 - math.floor(math.log10(step)))  # enough to print 2.5 × 10^k exactly
    first, last = math.floor(low / step), math.ceil(high / step)
    return [round(k * step, digits) for k in range(first, last + 1)]


def format_number(value: float) -> str:
    """Compact number: 950, 1.2k, 3.4M; two decimals below 10 for ratios such as accept length."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.1f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 1e3:
        return f"{value / 1e3:.1f}k"
    if magnitude >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}"


def format_duration(seconds: float) -> str:
    """`42s`, `7m`, `3h05m`, `2d04h`: short enough for an axis tick or a table cell."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        minutes, secs = divmod(seconds, 60)
        return f"{minutes}m" if secs == 0 else f"{minutes}m{secs:02d}s"
    if seconds < 86400:
        hours, rest = divmod(seconds, 3600)
        return f"{hours}h{rest // 60:02d}m"
    days, rest = divmod(seconds, 86400)
    return f"{days}d{rest // 3600:02d}h"


def time_ticks(start: float, end: float, count: int = 6) -> list[float]:
    """Tick positions (seconds) at a round step (1 s … 1 d) covering [start, end]."""
    span = max(end - start, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= count), 86400 * math.ceil(span / 86400 / count))
    first = math.ceil(start / step) * step
    return [first + k * step for k in range(int((end - first) // step) + 1)]


def _frame(width: int, height: int, title: str, body: str, klass: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {klass}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
        f'<text x="8" y="16" class="chart-title" font-size="12" font-weight="600" fill="#111827">'
        f"{escape(title)}</text>{body}</svg>"
    )


def _empty(width: int, height: int, title: str, text: str, klass: str) -> str:
    body = (
        f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="12" fill="#6b7280" '
        f'class="chart-empty">{escape(text)}</text>'
    )
    return _frame(width, height, title, body, klass + " is-empty")


def _y_axis(ticks: Sequence[float], y_of: _Scale, left: float, right: float) -> str:
    parts = []
    for tick in ticks:
        y = y_of(tick)
        parts.append(
            f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>'
            f'<text x="{left - 4}" y="{y + 3:.1f}" text-anchor="end" font-size="10" fill="#6b7280">'
            f"{format_number(tick)}</text>"
        )
    return "".join(parts)


class _Scale:
    """Linear map from a data interval onto a pixel interval."""

    def __init__(self, lo: float, hi: float, px_lo: float, px_hi: float) -> None:
        self.lo, self.hi, self.px_lo, self.px_hi = lo, (hi if hi != lo else lo + 1.0), px_lo, px_hi

    def __call__(self, value: float) -> float:
        return self.px_lo + (value - self.lo) / (self.hi - self.lo) * (self.px_hi - self.px_lo)


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    width: int = 640,
    height: int = 220,
    y_min: float | None = 0.0,
    empty_text: str = "no samples yet",
    klass: str = "line",
) -> str:
    """Lines over time (x in seconds, ticks shown as elapsed time from the first sample) with a legend."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return _empty(width, height, title, empty_text, klass)
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    y_ticks = nice_ticks(min(ys) if y_min is None else min(y_min, min(ys)), max(ys))
    left, right, top, bottom = _MARGIN_L, width - _MARGIN_R - 110, _MARGIN_T, height - _MARGIN_B
    x_of, y_of = _Scale(x0, x1, left, right), _Scale(y_ticks[0], y_ticks[-1], bottom, top)
    body = [_y_axis(y_ticks, y_of, left, right)]
    for tick in time_ticks(0.0, x1 - x0):
        x = x_of(x0 + tick)
        body.append(
            f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle" font-size="10" fill="#6b7280">'
            f"{format_duration(tick)}</text>"
        )
    for index, line in enumerate(drawn):
        color = line.color or (TOTAL_COLOR if line.is_total else color_for(index))
        path = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in line.points)
        stroke = 2.4 if line.is_total else 1.4
        body.append(
            f'<polyline class="series" data-name="{escape(line.name)}" fill="none" stroke="{color}" '
            f'stroke-width="{stroke}" stroke-linejoin="round" points="{path}"/>'
        )
        if len(line.points) == 1:  # a one-point polyline draws nothing: show the point itself
            x, y = line.points[0]
            body.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3" fill="{color}"/>')
        body.append(_legend_entry(index, line.name, color, right + 10, top))
    return _frame(width, height, title, "".join(body), klass)


def _legend_entry(index: int, name: str, color: str, x: float, top: float) -> str:
    y = top + 4 + index * 14
    return (
        f'<rect x="{x}" y="{y}" width="10" height="3" fill="{color}"/>'
        f'<text x="{x + 14}" y="{y + 5}" font-size="10" fill="#374151">{escape(name[:16])}</text>'
    )


def bin_edges(values: Sequence[float], num_bins: int = 20) -> list[float]:
    """`num_bins` + 1 equal-width edges from 0 to the largest value (at least 1 wide)."""
    high = max(values, default=0.0)
    width = max(math.ceil(high / num_bins), 1)
    return [float(k * width) for k in range(num_bins + 1)]


def bin_counts(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    """How many values fall in each [edge_k, edge_k+1) bin; the maximum lands in the last bin."""
    counts = [0] * (len(edges) - 1)
    width = edges[1] - edges[0]
    for value in values:
        index = min(int((value - edges[0]) // width), len(counts) - 1)
        counts[max(index, 0)] += 1
    return counts


def histogram(
    groups: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    num_bins: int = 24,
    width: int = 640,
    height: int = 220,
    klass: str = "histogram",
) -> str:
    """Overlaid histograms of several groups (e.g. reasoning vs answer tokens) on shared bins."""
    pooled = [v for _, values in groups for v in values]
    if not pooled:
        return _empty(width, height, title, "no finished results yet", klass)
    edges = bin_edges(pooled, num_bins)
    counted = [(name, bin_counts(values, edges)) for name, values in groups]
    peak = max(max(counts) for _, counts in counted)
    y_ticks = nice_ticks(0, peak, 4)
    left, right, top, bottom = _MARGIN_L, width - _MARGIN_R - 110, _MARGIN_T, height - _MARGIN_B
    x_of, y_of = _Scale(edges[0], edges[-1], left, right), _Scale(0, y_ticks[-1], bottom, top)
    body = [_y_axis(y_ticks, y_of, left, right)]
    for edge in edges[:: max(len(edges) // 6, 1)]:
        body.append(
            f'<text x="{x_of(edge):.1f}" y="{bottom + 14}" text-anchor="middle" font-size="10" '
            f'fill="#6b7280">{format_number(edge)}</text>'
        )
    for index, (name, counts) in enumerate(counted):
        color = color_for(index)
        for k, count in enumerate(counts):
            if count:
                x, x_next, y = x_of(edges[k]), x_of(edges[k + 1]), y_of(count)
                body.append(
                    f'<rect class="bin" x="{x:.1f}" y="{y:.1f}" width="{max(x_next - x - 1, 1):.1f}" '
                    f'height="{bottom - y:.1f}" fill="{color}" fill-opacity="0.55"/>'
                )
        body.append(_legend_entry(index, f"{name} ({len(groups[index][1])})", color, right + 10, top))
    return _frame(width, height, title, "".join(body), klass)


def bar_chart(bars: Sequence[Bar], *, title: str, width: int = 640, klass: str = "bars") -> str:
    """Horizontal bars, one row each, value written after the bar."""
    height = _MARGIN_T + 8 + 20 * max(len(bars), 1)
    if not bars:
        return _empty(width, height + 20, title, "nothing to show yet", klass)
    peak = max(max(b.value for b in bars), 1e-9)
    left, right = 150, width - 120
    scale = _Scale(0, peak, left, right)
    body = []
    for index, bar in enumerate(bars):
        y = _MARGIN_T + 4 + index * 20
        color = bar.color or color_for(index)
        note = f"  {bar.note}" if bar.note else ""
        body.append(
            f'<text x="{left - 6}" y="{y + 11}" text-anchor="end" font-size="11" fill="#374151">'
            f"{escape(bar.label[:22])}</text>"
            f'<rect class="bar" x="{left}" y="{y}" width="{max(scale(bar.value) - left, 1):.1f}" height="14" '
            f'fill="{color}"/><text x="{scale(bar.value) + 5:.1f}" y="{y + 11}" font-size="11" '
            f'fill="#111827">'
            f"{format_number(bar.value)}{escape(note)}</text>"
        )
    return _frame(width, height, title, "".join(body), klass)


def paired_bars(
    rows: Sequence[tuple[str, float | None, float | None, bool]],
    *,
    title: str,
    labels: tuple[str, str],
    width: int = 640,
    klass: str = "paired",
) -> str:
    """Two bars per row (e.g. planned vs actual capacity); a row flagged True draws its second bar red."""
    height = _MARGIN_T + 24 + 30 * max(len(rows), 1)
    if not rows:
        return _empty(width, height, title, "no plan or no metrics yet", klass)
    peak = max([v for _, a, b, _ in rows for v in (a, b) if v is not None] + [1e-9])
    left, right = 150, width - 90
    scale = _Scale(0, peak, left, right)
    colors = ("#9ca3af", PALETTE[0])
    body = [_legend_entry(k, labels[k], colors[k], right - 40, 2) for k in range(2)]
    for index, (label, first, second, is_short) in enumerate(rows):
        y = _MARGIN_T + 10 + index * 30
        body.append(
            f'<text x="{left - 6}" y="{y + 15}" text-anchor="end" font-size="11" fill="#374151">'
            f"{escape(label[:22])}</text>"
        )
        for k, (value, color) in enumerate(
            ((first, "#9ca3af"), (second, SICK_COLOR if is_short else PALETTE[0]))
        ):
            yy = y + k * 12
            if value is None:  # unknown is not zero: say so instead of drawing an empty bar
                body.append(f'<text x="{left + 2}" y="{yy + 9}" font-size="10" fill="#6b7280">')
                body.append("unknown</text>")
                continue
            bar_width = max(scale(value) - left, 1)
            body.append(
                f'<rect class="bar" x="{left}" y="{yy}" height="10" width="{bar_width:.1f}" '
                f'fill="{color}"/><text x="{scale(value) + 4:.1f}" y="{yy + 9}" font-size="10" '
                f'fill="#111827">{format_number(value)}</text>'
            )
    return _frame(width, height, title, "".join(body), klass)
