"""fleetgen's one chart renderer: line charts, histograms and bar charts as `<svg>` strings.

Pure functions from numbers to SVG, drawn the same for the live page (swapped in at every poll), the
self-contained report (inlined) and every PNG (`report --png`, `bench --png`: this SVG rasterised by
`chromium.svg_to_png`). Every text is escaped; an empty input draws an empty frame that says so (a chart
that silently draws nothing looks like a broken page).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#16a34a", "#d97706", "#9333ea", "#0891b2", "#db2777", "#65a30d", "#ea580c")
TOTAL_COLOR, SICK_COLOR, GREY = "#111827", "#dc2626", "#9ca3af"
WIDTH, HEIGHT = 640, 220
NOTE_WIDTH, NOTE_CHARS = 250, 40  # a bar chart with notes leaves this much room right of its longest bar
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 12, 26, 30  # margins around the plot area
_TICK = 'text-anchor="middle" font-size="10" fill="#6b7280"'


@dataclass(frozen=True)
class Series:
    """One line: `points` are (x, y); x is seconds for time charts."""

    name: str
    points: Sequence[tuple[float, float]]
    is_total: bool = False  # drawn thick and dark, whatever the palette


@dataclass(frozen=True)
class Bar:
    """One horizontal bar: a label and a value (None: unknown, written as such), an optional colour and a
    note written after its value (what else the bar stands for: a ratio, a count, "chosen")."""

    label: str
    value: float | None
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


def time_ticks(span: float, count: int = 6) -> list[float]:
    """Tick positions (seconds) at a round step (1 s … 1 d) from 0 to `span`."""
    step = next((s for s in _TIME_STEPS if span / s <= count), 86400 * math.ceil(span / 86400 / count))
    return [k * step for k in range(int(span // step) + 1)]


def _frame(height: int, title: str, body: str, *, is_empty: bool = False) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart{" is-empty" if is_empty else ""}" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{escape(title)}"><rect width="{WIDTH}" height="{height}" fill="#ffffff"/>'
        f'<text x="8" y="16" class="chart-title" font-size="12" font-weight="600" fill="#111827">'
        f"{escape(title)}</text>{body}</svg>"
    )


def _empty(height: int, title: str, text: str) -> str:
    body = f'<text x="{WIDTH / 2}" y="{height / 2}" {_TICK} class="chart-empty">{escape(text)}</text>'
    return _frame(height, title, body, is_empty=True)


class _Scale:
    """Linear map from a data interval onto a pixel interval."""

    def __init__(self, lo: float, hi: float, px_lo: float, px_hi: float) -> None:
        self.lo, self.hi, self.px_lo, self.px_hi = lo, (hi if hi != lo else lo + 1.0), px_lo, px_hi

    def __call__(self, value: float) -> float:
        return self.px_lo + (value - self.lo) / (self.hi - self.lo) * (self.px_hi - self.px_lo)


def _axes(y_ticks: Sequence[float], x_ticks: Sequence[tuple[float, str]], x_of: _Scale, y_of: _Scale) -> str:
    """Horizontal grid lines with their values on the left, and labels under the x axis."""
    left, right, bottom = x_of.px_lo, x_of.px_hi, y_of.px_lo
    parts = [
        f'<line x1="{left}" x2="{right}" y1="{y_of(t):.1f}" y2="{y_of(t):.1f}" stroke="#e5e7eb"/>'
        f'<text x="{left - 4}" y="{y_of(t) + 3:.1f}" text-anchor="end" font-size="10" fill="#6b7280">'
        f"{format_number(t)}</text>"
        for t in y_ticks
    ]
    parts += [
        f'<text x="{x_of(x):.1f}" y="{bottom + 14}" {_TICK}>{escape(text)}</text>' for x, text in x_ticks
    ]
    return "".join(parts)


def _legend(names: Sequence[str], colors: Sequence[str], x: float) -> str:
    return "".join(
        f'<rect x="{x}" y="{_TOP + 4 + k * 14}" width="10" height="3" fill="{color}"/>'
        f'<text x="{x + 14}" y="{_TOP + 9 + k * 14}" font-size="10" fill="#374151">{escape(name[:24])}</text>'
        for k, (name, color) in enumerate(zip(names, colors, strict=True))
    )


def _legend_width(names: Sequence[str]) -> int:
    return 24 + 6 * min(max(map(len, names), default=0), 24)


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_ticks: Sequence[tuple[float, str]] | None = None,
    y_min: float | None = 0.0,
    empty_text: str = "no samples yet",
) -> str:
    """Lines with a legend. x is seconds, labelled as time elapsed since the first point, unless `x_ticks`
    gives (x, label) pairs; the y axis starts at `y_min` (None: at the lowest value)."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return _empty(HEIGHT, title, empty_text)
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    y_ticks = nice_ticks(min(ys) if y_min is None else min(y_min, min(ys)), max(ys))
    right = WIDTH - _RIGHT - _legend_width([s.name for s in drawn])
    x_of, y_of = _Scale(x0, x1, _LEFT, right), _Scale(y_ticks[0], y_ticks[-1], HEIGHT - _BOTTOM, _TOP)
    if x_ticks is None:
        x_ticks = [(x0 + t, format_duration(t)) for t in time_ticks(x1 - x0)]
    colors = [TOTAL_COLOR if s.is_total else color_for(k) for k, s in enumerate(drawn)]
    body = [_axes(y_ticks, x_ticks, x_of, y_of)]
    for line, color in zip(drawn, colors, strict=True):
        path = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in line.points)
        body.append(
            f'<polyline class="series" data-name="{escape(line.name)}" fill="none" stroke="{color}" '
            f'stroke-width="{2.4 if line.is_total else 1.4}" stroke-linejoin="round" points="{path}"/>'
        )
        if len(line.points) == 1:  # a one-point polyline draws nothing: show the point itself
            x, y = line.points[0]
            body.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3" fill="{color}"/>')
    body.append(_legend([s.name for s in drawn], colors, right + 10))
    return _frame(HEIGHT, title, "".join(body))


def bin_edges(values: Sequence[float], num_bins: int = 20) -> list[float]:
    """`num_bins` + 1 equal-width edges from 0 to the largest value (at least 1 wide)."""
    width = max(math.ceil(max(values, default=0.0) / num_bins), 1)
    return [float(k * width) for k in range(num_bins + 1)]


def bin_counts(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    """How many values fall in each [edge_k, edge_k+1) bin; the maximum lands in the last bin."""
    counts = [0] * (len(edges) - 1)
    width = edges[1] - edges[0]
    for value in values:
        counts[max(min(int((value - edges[0]) // width), len(counts) - 1), 0)] += 1
    return counts


def histogram(groups: Sequence[tuple[str, Sequence[float]]], *, title: str, num_bins: int = 24) -> str:
    """Overlaid histograms of several groups (e.g. reasoning vs answer tokens) on shared bins."""
    pooled = [v for _, values in groups for v in values]
    if not pooled:
        return _empty(HEIGHT, title, "no finished results yet")
    edges = bin_edges(pooled, num_bins)
    counted = [bin_counts(values, edges) for _, values in groups]
    names = [f"{name} ({len(values)})" for name, values in groups]
    y_ticks = nice_ticks(0, max(max(counts) for counts in counted), 4)
    right = WIDTH - _RIGHT - _legend_width(names)
    x_of, y_of = _Scale(edges[0], edges[-1], _LEFT, right), _Scale(0, y_ticks[-1], HEIGHT - _BOTTOM, _TOP)
    x_ticks = [(edge, format_number(edge)) for edge in edges[:: max(len(edges) // 6, 1)]]
    body = [_axes(y_ticks, x_ticks, x_of, y_of)]
    for index, counts in enumerate(counted):
        for k, count in enumerate(counts):
            if count:
                x, x_next, y = x_of(edges[k]), x_of(edges[k + 1]), y_of(count)
                body.append(
                    f'<rect class="bin" x="{x:.1f}" y="{y:.1f}" width="{max(x_next - x - 1, 1):.1f}" '
                    f'height="{y_of.px_lo - y:.1f}" fill="{color_for(index)}" fill-opacity="0.55"/>'
                )
    body.append(_legend(names, [color_for(k) for k in range(len(names))], right + 10))
    return _frame(HEIGHT, title, "".join(body))


def bar_chart(bars: Sequence[Bar], *, title: str, empty_text: str = "nothing to show yet") -> str:
    """Horizontal bars, one row each, the value written after the bar ("unknown" for None)."""
    height = max(HEIGHT, _TOP + 8 + 20 * len(bars))  # never shorter than a line chart beside it
    if not bars:
        return _empty(height, title, empty_text)
    left, right = 160, WIDTH - (NOTE_WIDTH if any(b.note for b in bars) else 110)
    scale = _Scale(0, max([b.value for b in bars if b.value is not None] + [1e-9]), left, right)
    body = []
    for index, bar in enumerate(bars):
        y = _TOP + 4 + index * 20
        body.append(
            f'<text x="{left - 6}" y="{y + 11}" text-anchor="end" font-size="11" fill="#374151">'
            f"{escape(bar.label[:26])}</text>"
        )
        if bar.value is None:  # unknown is not zero: say so instead of drawing an empty bar
            body.append(f'<text x="{left + 2}" y="{y + 11}" font-size="10" fill="#6b7280">unknown</text>')
            end = left + 50.0
        else:
            body.append(
                f'<rect class="bar" x="{left}" y="{y}" width="{max(scale(bar.value) - left, 1):.1f}" '
                f'height="14" fill="{bar.color or color_for(index)}"/><text x="{scale(bar.value) + 5:.1f}" '
                f'y="{y + 11}" font-size="11" fill="#111827">{format_number(bar.value)}</text>'
            )
            end = scale(bar.value) + 5 + 7 * len(format_number(bar.value))
        if bar.note:
            body.append(
                f'<text class="note" x="{end + 6:.1f}" y="{y + 11}" font-size="10" fill="#374151">'
                f"{escape(bar.note[:NOTE_CHARS])}</text>"
            )
    return _frame(height, title, "".join(body))
