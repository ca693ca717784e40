"""The bench suite, one command: every comparison side by side in the same run, one table, one JSON.

    .venv/bin/python bench/run.py [--only driver_cost,saturation,scale,deploy] [--quick] [--name NAME]

Sections (bench/sections/*.py) each return rows: a metric for fleetgen and its peers, the ratio the target is
about, the target, and whether it holds. A section whose pieces are missing here says what is missing and is
listed as not run; the others still run. Results: bench/results/<name>.json (rows + every raw measurement).
Peers live in their own venv (bench/setup.sh); the machines are noisy, so read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import Context, Row
from sections import deploy, driver_cost, saturation, scale

SECTIONS = {
    "driver_cost": driver_cost.run,
    "saturation": saturation.run,
    "scale": scale.run,
    "deploy": deploy.run,
}
COLUMN_ORDER = ("fleetgen", "openai-loop", "curator", "vllm-bench", "server")


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def table(rows: list[Row]) -> str:
    """One plain-text table: every driver side by side, the ratio, the target and a verdict."""
    drivers = [d for d in COLUMN_ORDER if any(d in r.values for r in rows)]
    drivers += sorted({d for r in rows for d in r.values} - set(drivers))
    header = ["section", "metric", "unit", *drivers, "ratio", "(of)", "target", "ok"]
    lines = [header]
    for r in rows:
        verdict = {True: "yes", False: "NO", None: ""}[r.is_met] + (f" ({r.note})" if r.note else "")
        ratio = f"{r.ratio:.2f}×" if r.ratio is not None else ""
        lines.append(
            [
                r.section,
                r.metric,
                r.unit,
                *(fmt(r.values.get(d)) for d in drivers),
                ratio,
                r.ratio_text,
                r.target,
                verdict,
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def machine() -> dict[str, object]:
    commit = subprocess.run(
        ["git", "-C", str(common.REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="", help="comma-separated sections: " + ", ".join(SECTIONS))
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes (minutes instead of tens of minutes)"
    )
    parser.add_argument("--name", default="", help="results file name (default: quick or full)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, outputs)")
    args = parser.parse_args()
    chosen = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    name = args.name or ("quick" if args.quick else "full")
    scratch = Path(tempfile.mkdtemp(prefix="fleetgen-bench-"))
    rows: list[Row] = []
    details: dict[str, object] = {}
    not_run: dict[str, str] = {}
    for section in chosen:
        workdir = scratch / section
        workdir.mkdir()
        ctx = Context(workdir, args.quick, details)
        common.log(f"section {section} (scratch {workdir})")
        try:
            rows += SECTIONS[section](ctx)
        except common.Skip as exc:
            not_run[section] = f"skipped: {exc}"
        except Exception as exc:  # a broken section must not hide the others' numbers; its trace is kept
            not_run[section] = f"failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
        if section in not_run:
            common.log(f"section {section} not run: {not_run[section][:800]}")
    print(table(rows))
    for section, why in not_run.items():
        print(f"\nnot run: {section}: {why.splitlines()[0][:600]}")
    result = {
        "name": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "rows": [dataclasses.asdict(r) for r in rows],
        "not_run": not_run,
        "details": details,
        "scratch": str(scratch) if args.keep else None,
    }
    out = common.REPO / "bench" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {out}")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    failed = [r for r in rows if r.is_met is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
