"""Scale: 1,000,000 input records (short prompts, instant server) — peak RSS, then resume latency.

1. `fleetgen run` over N short records against the sim at zero latency, short answers: the driver's peak RSS
   (`wait4`'s ru_maxrss) and its rate.
2. Resume: K new records are appended to the same input and `fleetgen run` is started again on the same
   output folder, which already holds N rows. Time to first dispatch = the earliest `started_at` of the new
   rows (the client stamps it when it sends) minus the moment the process was spawned.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import common
from common import Context, Row

OUTPUT_TOKENS = 16
CONCURRENCY = 256
MODEL = "sim-model"
NUM_NEW = 1_000


def fleetgen(
    ctx: Context, input_path: Path, out: Path, url: str, label: str
) -> tuple[common.Measured, float]:
    argv = common.fleetgen_run_argv(input_path, out, [url], concurrency=CONCURRENCY, max_tokens=OUTPUT_TOKENS)
    spawned_at = time.time()
    m = common.measure(argv, ctx.workdir / f"fleetgen-{label}.log", timeout_s=7200)
    if m.returncode != 0:
        raise RuntimeError(f"fleetgen run ({label}) exited {m.returncode}:\n{m.log_tail()}")
    return m, spawned_at


def stored(out: Path) -> tuple[int, float | None]:
    """Rows stored, and the earliest dispatch among the rows of the resumed run (ids from the new block)."""
    with sqlite3.connect(out / "results.sqlite") as db:
        num = int(db.execute("SELECT count(*) FROM results").fetchone()[0])
        first = db.execute("SELECT min(started_at) FROM results WHERE id LIKE 'new%'").fetchone()[0]
    return num, first


def run(ctx: Context) -> list[Row]:
    common.need_fleetgen_command("run")
    num = 100_000 if ctx.quick else 1_000_000
    input_path = common.write_records(ctx.workdir / "records.jsonl", num, prompt_words=6)
    out = ctx.workdir / "out"
    with common.sim_server(ctx.workdir, output_tokens=OUTPUT_TOKENS) as sim:
        common.log(f"scale: fleetgen run × {num:,} (short prompts, {OUTPUT_TOKENS}-token answers)")
        first, _ = fleetgen(ctx, input_path, out, sim.base_url, "first")
        count, _ = stored(out)
        if count != num:
            raise RuntimeError(f"fleetgen stored {count:,} of {num:,} rows:\n{first.log_tail()}")
        with input_path.open("a", encoding="utf-8") as f:
            for i in range(NUM_NEW):
                f.write(json.dumps({"id": f"new{i}", "prompt": f"new task {i}"}) + "\n")
        common.log(f"scale: resume with {num:,} rows stored and {NUM_NEW} new records")
        resumed, spawned_at = fleetgen(ctx, input_path, out, sim.base_url, "resume")
    count, first_dispatch = stored(out)
    if count != num + NUM_NEW or first_dispatch is None:
        raise RuntimeError(f"after resume {count:,} rows (want {num + NUM_NEW:,}):\n{resumed.log_tail()}")
    to_first = float(first_dispatch) - spawned_at
    ctx.details["scale"] = {
        "num_records": num,
        "first": {"wall_s": first.wall_s, "cpu_s": first.cpu_s, "max_rss_mb": first.max_rss_mb},
        "resume": {
            "wall_s": resumed.wall_s,
            "cpu_s": resumed.cpu_s,
            "max_rss_mb": resumed.max_rss_mb,
            "to_first_dispatch_s": to_first,
        },
    }
    label = f"{num:,} records"
    return [
        Row(
            "scale",
            f"driver peak RSS, {label}",
            "MB",
            {"fleetgen": first.max_rss_mb},
            target="≤ 300 MB",
            is_met=first.max_rss_mb <= 300,
        ),
        Row(
            "scale",
            f"rate, {label} ({OUTPUT_TOKENS}-token answers)",
            "compl/s",
            {"fleetgen": num / first.wall_s},
        ),
        Row(
            "scale",
            f"resume: run → first dispatch, {label} stored, {NUM_NEW} appended",
            "s",
            {"fleetgen": to_first},
            target="≤ 5 s",
            is_met=to_first <= 5,
        ),
        Row("scale", "resume: driver peak RSS", "MB", {"fleetgen": resumed.max_rss_mb}),
    ]
