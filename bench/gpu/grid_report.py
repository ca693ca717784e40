"""The grid's table from its logs: each setting's decode lines (SGLang's own `Decode batch` log: running
requests, `gen throughput`, accept length)
over the last `--window` seconds of its run, beside what grid.py measured.

    python bench/gpu/grid_report.py DIR --name grid-sglang-0.5.15-h200 [--window 60]

Reads DIR/<setting>.log (+ .json when the setting finished), writes bench/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
LINE = re.compile(
    r"\[(?P<t>\S+ \S+)\] Decode batch, #running-req: (?P<run>\d+).*?"
    r"(?:accept len: (?P<acc>[\d.]+).*?)?gen throughput \(token/s\): (?P<gen>[\d.]+)"
)


def decode_window(log: Path, window: float) -> dict[str, float | int | None]:
    """Mean running requests and decode tok/s over the log's last `window` seconds of decode lines."""
    pts = []
    for m in LINE.finditer(log.read_text(errors="replace")):
        t = dt.datetime.strptime(m["t"], "%Y-%m-%d %H:%M:%S")
        pts.append((t, int(m["run"]), float(m["gen"]), float(m["acc"]) if m["acc"] else None))
    if not pts:
        return {"decode_lines": 0}
    last = [p for p in pts if (pts[-1][0] - p[0]).total_seconds() <= window]
    return {
        "decode_lines": len(last),
        "running": round(sum(p[1] for p in last) / len(last), 1),
        "decode_tok_s": round(sum(p[2] for p in last) / len(last)),
        "accept_length": last[-1][3],
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir", type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--window", type=float, default=60.0)
    a = p.parse_args()
    rows = []
    for log in sorted(a.dir.glob("*.log"), key=lambda f: f.stat().st_mtime):
        meta = a.dir / f"{log.stem}.json"
        got = json.loads(meta.read_text()) if meta.exists() else {}
        row = {
            "setting": log.stem,
            "args": got.get("args"),
            "env": got.get("env"),
            "admitted": got.get("admitted"),
        }
        row |= decode_window(log, a.window)
        row["finished_tok_s"] = round(got["output_tok_s"]) if got.get("output_tok_s") else None
        row["error"] = got.get("error", "no result: the run was cut off" if not got else "")
        rows.append(row)
    base = next((r["decode_tok_s"] for r in rows if r["setting"] == "defaults" and "decode_tok_s" in r), None)
    md = [
        "| setting | admitted | running | decode tok/s | × defaults | accept len | flags |",
        "|---" * 7 + "|",
    ]
    for r in rows:
        tok = r.get("decode_tok_s")
        ratio = f"{tok / base:.2f}" if tok and base else "—"
        flags = " ".join(r["args"] or []) or "(the engine's defaults)"
        md.append(
            f"| {r['setting']} | {r['admitted']} | {r.get('running', '—')} | {tok or '—'} | {ratio} | "
            f"{r.get('accept_length') or '—'} | `{flags}` {r['error']} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (RESULTS / f"{a.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
