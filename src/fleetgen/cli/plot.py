"""The PNG of `fleetgen bench --png`: output tok/s against concurrency, one line per instance (and the fleet).

matplotlib is an optional dependency (`pip install 'fleetgen[bench]'`): this module imports it at the top, and
`fleetgen.cli.bench` loads this module only when a PNG is asked for, so fleetgen runs without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never look for a display

import matplotlib.pyplot as plt

from fleetgen.bench.stats import LevelResult


def plot_throughput(levels: Sequence[LevelResult], path: Path, *, title: str) -> Path:
    """Write output tok/s vs concurrency (log x) per target; spec-on/off runs are labelled by their target."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for target in dict.fromkeys(r.target for r in levels):
        rows = sorted((r for r in levels if r.target == target), key=lambda r: r.concurrency)
        ax.plot([r.concurrency for r in rows], [r.output_tok_s for r in rows], marker="o", label=target)
    ax.set_xscale("log", base=2)
    ticks = sorted({r.concurrency for r in levels})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("concurrency per instance")
    ax.set_ylabel("output tokens / s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
