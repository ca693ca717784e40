"""`fleetgen report`: one self-contained HTML file for a finished or running job, plus PNGs on request.

The HTML inlines its CSS and SVG charts (no script, no external reference), so it can be mailed or
attached to a ticket. PNGs are the same SVG charts rasterised (`chromium.svg_to_png`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from fleetgen.atomic import write_atomic
from fleetgen.dashboard import chromium, page, render
from fleetgen.dashboard.jobdata import JobReader
from fleetgen.dashboard.model import JobView

NUM_LISTED_ERRORS = 200  # the error table lists the latest ones; the caption says how many are left out


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote."""

    html: Path
    pngs: tuple[Path, ...]
    job: JobView


def read_job(out_dir: Path) -> JobView:
    """The job in `out_dir` as it is now, with up to `NUM_LISTED_ERRORS` error rows."""
    with contextlib.closing(JobReader(out_dir)) as reader:
        return reader.read(num_errors=NUM_LISTED_ERRORS)


async def write_report(out_dir: Path, to: Path | None = None, *, png: bool = False) -> ReportFiles:
    """Write `to` (default `OUT_DIR/report.html`) and, with `png`, one PNG per chart next to it."""
    job = await asyncio.to_thread(read_job, out_dir)
    html_path = to or out_dir / "report.html"
    await asyncio.to_thread(write_atomic, html_path, page.report_page(job))
    pngs: list[Path] = []
    if png:
        for name, svg in render.charts(job, ()).items():
            if "is-empty" not in svg:  # an empty frame is no picture worth a file
                target = html_path.with_name(f"{html_path.stem}-{name.removeprefix('chart-')}.png")
                pngs.append(await asyncio.to_thread(chromium.svg_to_png, svg, target))
    return ReportFiles(html=html_path, pngs=tuple(pngs), job=job)
