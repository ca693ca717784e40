"""`fleetgen tune`'s chart (`cli.tune.chart`): every measured candidate is a bar (or "unknown" with why),
noted with its ratio to the fleet file's own settings and the running requests it ran; the chosen one is named
"chosen", in the accent colour. Checked on the H100's measured candidates at 0.85
(../shared/data/real-engines/sglang-0.5.15-h100-tune/mf085) and on two classes at once."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from fleetgen.cli.tune import chart
from fleetgen.dashboard import svg
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.session import TuneResult
from fleetgen.tune.verdict import Measured, winner
from tests.unit.plan.test_throughput import job
from tests.unit.tune._helpers import H200, setting

NS = "{http://www.w3.org/2000/svg}"
H100 = GpuClass(80, 1)
# (name, running, decode tok/s, error) as tune measured them on the H100 at 0.85
Row = tuple[str, float, float | None, str]
H100_ROWS: list[Row] = [
    ("as-written", 10.0, 411.2, ""),
    ("no-radix-58-replayssm", 57.4, 1652.1, ""),
    ("no-radix-11-mtp", 1.0, None, "stalled: 1 of 11 running, 8 queued over the whole window"),
    ("no-radix-58", 57.5, 1697.0, ""),
    ("no-radix-43", 42.6, 1382.0, ""),
]


def _result(rows: dict[GpuClass, list[Row]]) -> TuneResult:
    result = TuneResult(job(), {cls: [f"{cls.name}-0"] for cls in rows})
    for cls, found in rows.items():
        for name, running, tps, error in found:
            s = setting(name, round(running))
            result.measured.append(
                Measured(cls, s, "h-0", "2026-12-06 19:00 UTC", running=running, decode_tps=tps, error=error)
            )
        mine = [m for m in result.measured if m.gpu_class == cls]
        result.baselines[cls] = mine[0]
        best = winner(mine)
        assert best is not None
        result.chosen[cls] = best
    return result


def _rows(drawn: str) -> list[str]:
    """Each row's texts (label, value or "unknown", note), in order."""
    root = ET.fromstring(drawn)
    words = [t.text or "" for t in root.iter(f"{NS}text")][1:]  # the title first
    return words


def test_each_bar_says_its_ratio_and_running_requests_and_the_chosen_is_named() -> None:
    result = _result({H100: H100_ROWS})
    words = _rows(chart(result))
    assert "1.00× · 10 running" in words
    assert "4.13× · 58 running · chosen" in words  # 1,697 / 411
    assert "4.02× · 57 running" in words and "3.36× · 43 running" in words
    assert [w for w in words if w.endswith("chosen")] == ["4.13× · 58 running · chosen"]
    assert "unknown" in words and any(w.startswith("no rate: stalled: 1 of 11") for w in words)
    assert "no-radix-58" in words and not any(w.startswith("80 GiB ") for w in words)  # one class: names
    root = ET.fromstring(chart(result))
    colours = [r.get("fill") for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    assert colours.count(svg.color_for(0)) == 1 and len(colours) == 4


def test_two_classes_each_name_their_own_chosen_and_their_own_ratio() -> None:
    h200: list[Row] = [
        ("as-written", 44.0, 1561.0, ""),
        ("no-radix-263-replayssm", 262.0, 4398.0, ""),
    ]
    words = _rows(chart(_result({H100: H100_ROWS, H200: h200})))
    chosen = [w for w in words if w.endswith("chosen")]
    assert chosen == ["4.13× · 58 running · chosen", "2.82× · 262 running · chosen"]
    assert f"{H200.name} as-written" in words and f"{H100.name} no-radix-58" in words
