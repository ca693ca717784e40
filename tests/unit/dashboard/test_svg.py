"""The one chart renderer (`dashboard.svg`): every chart the live page, the report and the PNGs show.

Invariants over ugly inputs: the SVG is well-formed XML whatever the names hold; every series, bin and bar
of the input is drawn, with its own number of points, in the order of its values, inside the plot area; the
texts say the input's names and values. The bench PNG's chart is checked the same way.

Filed under `dashboard/svg.py`; bench's chart is built in `cli/bench.py`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hypothesis import example, given
from hypothesis import strategies as st

from fleetgen.bench.stats import LevelResult
from fleetgen.cli.bench import throughput_chart
from fleetgen.dashboard import svg

NS = "{http://www.w3.org/2000/svg}"
UGLY = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)  # XML forbids control chars
VALUES = st.floats(-1e9, 1e9, allow_nan=False)
POINTS = st.lists(st.tuples(VALUES, VALUES), max_size=25)


def parse(chart: str) -> ET.Element:
    root = ET.fromstring(chart)
    assert root.tag == f"{NS}svg" and root.get("width") == str(svg.WIDTH)
    return root


def coords(polyline: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in polyline.get("points", "").split())]


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def grid_span(root: ET.Element) -> tuple[float, float]:
    ys = [float(line.get("y1", "nan")) for line in root.iter(f"{NS}line")]
    return min(ys), max(ys)


def x_tick_labels(root: ET.Element) -> list[tuple[float, str]]:
    """The x axis' labels, told by structure (centred texts below the lowest grid line), not by their words:
    a legend entry or title may say anything, `c=` included. (x, text), left to right."""
    bottom = grid_span(root)[1]
    below = [t for t in root.iter(f"{NS}text") if float(t.get("y", "nan")) > bottom]
    return sorted((float(t.get("x", "nan")), t.text or "") for t in below if t.get("text-anchor") == "middle")


def agrees(data: list[float], pixels: list[float], sign: int) -> bool:
    """Pixels keep the order of the data (`sign` -1: flipped, as y is); pixels are rounded to 0.1."""
    pairs = list(zip(data, pixels, strict=True))
    return all(sign * (pb - pa) >= -0.11 for a, pa in pairs for b, pb in pairs if a < b)


@given(st.lists(st.tuples(UGLY, POINTS), max_size=6), UGLY, st.booleans())
def test_line_chart_draws_every_series_inside_its_axes(
    lines: list[tuple[str, list[tuple[float, float]]]], title: str, from_zero: bool
) -> None:
    series = [svg.Series(name, points) for name, points in lines]
    root = parse(svg.line_chart(series, title=title, y_min=0.0 if from_zero else None))
    assert root.get("aria-label") == title and texts(root)[0] == title
    drawn = [s for s in series if s.points]
    polylines = list(root.iter(f"{NS}polyline"))
    if not drawn:
        assert "is-empty" in root.get("class", "") and not polylines
        return
    assert [p.get("data-name") for p in polylines] == [s.name for s in drawn]
    assert all(s.name[:24] in texts(root) for s in drawn)  # the legend
    top, bottom = grid_span(root)  # the y axis' first and last grid lines
    for line, polyline in zip(drawn, polylines, strict=True):
        got = coords(polyline)
        assert len(got) == len(line.points)
        assert all(top - 0.11 <= y <= bottom + 0.11 and 0 <= x <= svg.WIDTH for x, y in got)
        assert agrees([x for x, _ in line.points], [x for x, _ in got], +1)
        assert agrees([y for _, y in line.points], [y for _, y in got], -1)


@given(st.lists(st.tuples(UGLY, st.none() | st.floats(0, 1e12)), max_size=14), UGLY)
def test_bar_chart_draws_a_bar_or_unknown_per_row_with_its_value(
    rows: list[tuple[str, float | None]], title: str
) -> None:
    root = parse(svg.bar_chart([svg.Bar(label, value) for label, value in rows], title=title))
    known = [v for _, v in rows if v is not None]
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    assert len(bars) == len(known)
    assert agrees(known, [float(b.get("width", "nan")) for b in bars], +1)
    words = texts(root)
    assert words.count("unknown") == len(rows) - len(known)
    assert all(svg.format_number(v) in words for v in known)
    assert all(label[:26] in words for label, _ in rows)
    assert ("is-empty" in root.get("class", "")) == (not rows)


@given(st.lists(st.integers(0, 50_000), max_size=300), st.lists(st.integers(0, 50_000), max_size=300))
def test_histogram_counts_every_value_of_every_group(first: list[int], second: list[int]) -> None:
    root = parse(svg.histogram([("reasoning", first), ("answer", second)], title="lengths"))
    if not first and not second:
        assert "is-empty" in root.get("class", "")
        return
    assert bars_per_legend_entry(root) == {
        f"reasoning ({len(first)})": len(first),
        f"answer ({len(second)})": len(second),
    }


def bars_per_legend_entry(root: ET.Element) -> dict[str, int]:
    """What a reader of the histogram sees: per legend entry (its swatch's colour), the values its bins
    hold, each bin's count read off its height with the y axis' own scale (grid line 0 and the top one)."""
    children = list(root)
    legend = {
        children[k + 1].text or "": el.get("fill")
        for k, el in enumerate(children)
        if el.tag == f"{NS}rect" and el.get("height") == "3"  # a legend swatch, then its text
    }
    grid = [  # (pixel y, value) of each grid line, read from the label after it
        (float(el.get("y1", "nan")), float(children[k + 1].text or "nan"))
        for k, el in enumerate(children)
        if el.tag == f"{NS}line"
    ]
    (y_zero, zero), (y_top, top) = max(grid), min(grid)
    assert zero == 0
    per_count = (y_zero - y_top) / top
    bins = [r for r in root.iter(f"{NS}rect") if r.get("class") == "bin"]
    return {
        name: sum(round(float(b.get("height", "nan")) / per_count) for b in bins if b.get("fill") == colour)
        for name, colour in legend.items()
    }


@given(st.floats(-1e6, 1e6), st.floats(0, 1e6))
def test_nice_ticks_cover_the_range(low: float, span: float) -> None:
    ticks = svg.nice_ticks(low, low + span)
    slack = 1e-9 * max(abs(low), 1.0)  # ticks are printed rounded; only float noise may fall outside
    assert ticks[0] <= low + slack and ticks[-1] >= low + span - slack
    assert ticks == sorted(ticks) and 2 <= len(ticks) <= 12


def level(target: str, concurrency: int, tok_s: float) -> LevelResult:
    return LevelResult(target, 1, concurrency, 1, 0, 1.0, 1, 1.0, tok_s, 1.0, None, None, None, None)


@given(
    st.lists(UGLY.filter(lambda t: t.strip()), min_size=1, max_size=4, unique=True),
    st.lists(st.integers(1, 4096), min_size=1, max_size=8, unique=True),
)
@example(targets=["c=", "c=2"], concurrencies=[1, 2])  # targets named like ticks: once read as ticks
def test_bench_chart_has_a_line_per_target_and_a_tick_per_level(
    targets: list[str], concurrencies: list[int]
) -> None:
    levels = [level(t, c, c * (k + 1) * 10.0) for k, t in enumerate(targets) for c in concurrencies]
    root = parse(throughput_chart(levels, "in 16 / out 8 tokens"))
    polylines = list(root.iter(f"{NS}polyline"))
    assert [p.get("data-name") for p in polylines] == targets
    assert all(len(coords(p)) == len(concurrencies) for p in polylines)
    ticks = x_tick_labels(root)
    assert [text for _, text in ticks] == [f"c={c}" for c in sorted(concurrencies)]
    for polyline in polylines:  # each tick stands under its level's point on every line
        assert sorted(x for x, _ in coords(polyline)) == [x for x, _ in ticks]
    for polyline in polylines:  # tok/s grows with concurrency here: the line rises left to right
        got = coords(polyline)  # x follows log2(concurrency); pixels are rounded to 0.1, so ties may swap
        xs = [x for x, _ in got]
        assert agrees(sorted(concurrencies), xs, +1) and agrees(xs, [-y for _, y in got], +1)
