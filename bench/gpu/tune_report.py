"""`fleetgen tune --json`'s result as the table the issue asks for, and the real job's time at its rates.

    python bench/gpu/tune_report.py TUNE_JSON [LABEL=TUNE_JSON ...] --name tune-sglang-0.5.15-h200
        [--completions 902087] [--tokens 1800]

Further runs of the same sitting (e.g. the MTP fleet file's, `mtp=path/tune.json`) join the table, their
candidates named `LABEL:candidate` and their ratio taken to the first run's as-written.

Writes bench/results/NAME.{json,md}: per candidate its flags, planned vs engine running requests, decode
tok/s, completions/s, the ratio to the fleet file's own settings; and the time 902,087 completions of ~1,800
tokens would take on one GPU at the chosen and the as-written rates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def days(completions: int, tokens: float, tok_s: float | None) -> str:
    return "—" if not tok_s else f"{completions * tokens / tok_s / 86400:.1f} days"


def _at(c: dict[str, Any]) -> str:
    return f"{c['candidate']} {c['decode_tps']:,.0f} tok/s at {c['mean_running']:.0f} running"


def table(result: dict[str, Any], completions: int, tokens: float) -> list[str]:
    md = [
        "| candidate | planned running | engine admitted | mean running | decode tok/s | completions/s "
        "| × as-written | flags |",
        "|---" * 8 + "|",
    ]
    for c in result["candidates"]:
        mark = " **(chosen)**" if c["chosen"] else ""
        ratio = f"{c['ratio_to_as_written']:.2f}" if c.get("ratio_to_as_written") else "—"
        tok = f"{c['decode_tps']:,.0f}" if c.get("decode_tps") else "—"
        done = f"{c['completions_per_s']:.2f}" if c.get("completions_per_s") else "—"
        admitted = c.get("engine_admitted", c.get("engine_running"))  # the key's name before 2026-12-03
        mean = f"{c['mean_running']:.1f}" if c.get("mean_running") is not None else "—"
        said = "; ".join([*c.get("notes", []), *([c["error"]] if c.get("error") else [])])
        md.append(
            f"| {c['candidate']}{mark} | {c['planned_running']} | {admitted} | {mean} | {tok} | "
            f"{done} | {ratio} | {c['change'] or '(the fleet file)'}{' — ' + said if said else ''} |"
        )
    ok = [c for c in result["candidates"] if c.get("decode_tps") and not c.get("error")]
    spec = [c for c in ok if "speculative" in " ".join(c["args"]) or c.get("accept_length")]
    plain = [c for c in ok if c not in spec]
    if spec and plain:
        best_s = max(spec, key=lambda c: c["decode_tps"])
        best_p = max(plain, key=lambda c: c["decode_tps"])
        ratio = best_s["decode_tps"] / best_p["decode_tps"]
        md += ["", f"Speculation at the best batch of each: {_at(best_s)} vs {_at(best_p)}: {ratio:.2f}×."]
    chosen = next((c for c in result["candidates"] if c["chosen"]), None)
    mine = next((c for c in result["candidates"] if c["candidate"] == "as-written"), None)
    md += [
        "",
        f"{completions:,} completions × {tokens:,.0f} tokens on this one GPU: "
        f"{days(completions, tokens, chosen and chosen['decode_tps'])} at the chosen settings, "
        f"{days(completions, tokens, mine and mine['decode_tps'])} at the fleet file's own.",
        f"Budget {result['budget_s']:.0f} s, used {result['used_s']:.0f} s; "
        f"not measured: {result['unmeasured']}.",
    ]
    return md


def joined(first: dict[str, Any], more: list[str]) -> dict[str, Any]:
    """The first run with each `LABEL=TUNE_JSON` run's candidates appended (ratio to the first as-written)."""
    mine = next((c for c in first["candidates"] if c["candidate"] == "as-written"), None)
    base = mine["decode_tps"] if mine and mine.get("decode_tps") else None
    out = {**first, "candidates": list(first["candidates"]), "runs": {"": first.get("out", "")}}
    for item in more:
        label, _, path = item.partition("=")
        run = json.loads(Path(path).read_text())
        out["runs"][label] = path
        out["budget_s"] += run["budget_s"]
        out["used_s"] += run["used_s"]
        out["unmeasured"] = {**out["unmeasured"], **{f"{label}:{k}": v for k, v in run["unmeasured"].items()}}
        for c in run["candidates"]:
            tps = c.get("decode_tps")
            ratio = tps / base if tps and base else None
            change = c["change"] or ", ".join(
                f"--{k} {v}" for k, v in c["args"].items() if mine and mine["args"].get(k) != v
            )
            out["candidates"].append(
                {
                    **c,
                    "candidate": f"{label}:{c['candidate']}",
                    "chosen": False,
                    "ratio_to_as_written": ratio,
                    "change": change,
                }
            )
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("tune_json", type=Path)
    p.add_argument("more", nargs="*", help="LABEL=TUNE_JSON: a further run of the same sitting")
    p.add_argument("--name", required=True)
    p.add_argument("--completions", type=int, default=902_087)
    p.add_argument("--tokens", type=float, default=1800.0)
    a = p.parse_args()
    result = joined(json.loads(a.tune_json.read_text()), a.more)
    md = table(result, a.completions, a.tokens)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{a.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
