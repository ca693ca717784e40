"""Driver cost: CPU per 1,000 completions and the wall rate, fleetgen vs the usual script vs Curator.

Against an instant server (`fleetgen.sim`, zero latency, ~1,800-token responses with reasoning), each driver
generates the same records from the same input at the same concurrency, against a fresh server. The driver's
user+sys CPU comes from `wait4` on its process; the server's CPU is read from /proc and reported beside it, so
a run where the server was the limit (one core saturated) is called that instead of blamed on the driver.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import common
from common import Context, Measured, Row

OUTPUT_TOKENS = 1800
CONCURRENCY = 256
MODEL = "sim-model"
SERVER_BOUND_CORES = 0.9  # the sim is single-threaded: ≥ 0.9 of a core busy means it set the pace


def driver_argv(name: str, input_path: Path, out: Path, url: str) -> list[str]:
    if name == "fleetgen":
        return common.fleetgen_run_argv(
            input_path, out, [url], concurrency=CONCURRENCY, max_tokens=OUTPUT_TOKENS + 200
        )
    script = "openai_loop.py" if name == "openai-loop" else "curator_gen.py"
    return [
        common.python_for_bench(),
        str(common.REPO / "bench" / "peers" / script),
        str(input_path),
        str(out),
        "--base-url",
        url + "/v1",
        "--model",
        MODEL,
        "--concurrency",
        str(CONCURRENCY),
        "--max-tokens",
        str(OUTPUT_TOKENS + 200),
    ]


def count_outputs(name: str, out: Path) -> int:
    """How many completions a driver stored (each in its own format)."""
    if name == "fleetgen":
        with sqlite3.connect(out / "results.sqlite") as db:
            return int(db.execute("SELECT count(*) FROM results").fetchone()[0])
    if name == "openai-loop":
        return sum(1 for line in out.read_text().splitlines() if line.strip())
    files = list(out.rglob("responses_*.jsonl"))
    return sum(1 for f in files for line in f.read_text().splitlines() if '"response_errors": null' in line)


def sustained_rate(out: Path) -> float:
    """Completions per second between fleetgen's first dispatch and its last completion (its own stamps)."""
    with sqlite3.connect(out / "results.sqlite") as db:
        num, first, last = db.execute(
            "SELECT count(*), min(started_at), max(finished_at) FROM results"
        ).fetchone()
    return float(num) / (float(last) - float(first))


def run_one(ctx: Context, name: str, input_path: Path, num: int) -> dict[str, object]:
    out = ctx.workdir / f"out-{name}"
    if name == "openai-loop":
        out = ctx.workdir / "out-openai-loop.jsonl"
    with common.sim_server(ctx.workdir, output_tokens=OUTPUT_TOKENS) as sim:
        argv = driver_argv(name, input_path, out, sim.base_url)
        common.log(f"driver_cost: {name} × {num} …")
        server_cpu0 = sim.cpu_s()
        m: Measured = common.measure(argv, ctx.workdir / f"{name}.log")
        server_cores = (sim.cpu_s() - server_cpu0) / m.wall_s
    if m.returncode != 0:
        raise RuntimeError(f"{name} exited {m.returncode}:\n{m.log_tail()}")
    stored = count_outputs(name, out)
    sustained = sustained_rate(out) if name == "fleetgen" else None
    result: dict[str, object] = {
        "wall_s": m.wall_s,
        "cpu_s": m.cpu_s,
        "cpu_user_s": m.cpu_user_s,
        "cpu_sys_s": m.cpu_sys_s,
        "max_rss_mb": m.max_rss_mb,
        "stored": stored,
        "server_cores": server_cores,
        "cpu_s_per_1k": m.cpu_s / num * 1000,
        "sustained_rate": sustained,
        "rate": num / m.wall_s,
        "argv": m.argv,
    }
    common.log(f"driver_cost: {name}: {json.dumps({k: v for k, v in result.items() if k != 'argv'})}")
    if stored != num:
        raise RuntimeError(f"{name} stored {stored} of {num} completions:\n{m.log_tail()}")
    return result


def run(ctx: Context, drivers: tuple[str, ...] = ("fleetgen", "openai-loop", "curator")) -> list[Row]:
    num = 2_000 if ctx.quick else 10_000
    input_path = common.write_records(ctx.workdir / "records.jsonl", num)
    results: dict[str, dict[str, object]] = {}
    skipped: dict[str, str] = {}
    for name in drivers:
        try:
            if name == "fleetgen":
                common.need_fleetgen_command("run")
            results[name] = run_one(ctx, name, input_path, num)
        except (common.Skip, RuntimeError) as exc:
            skipped[name] = str(exc)[-600:]
            common.log(f"driver_cost: {name} did not run: {exc}")
    ctx.details["driver_cost"] = {
        "num_records": num,
        "concurrency": CONCURRENCY,
        "output_tokens": OUTPUT_TOKENS,
        "results": results,
        "not_run": skipped,
    }
    if "fleetgen" not in results:
        raise common.Skip(skipped.get("fleetgen", "fleetgen did not run"))
    return rows(results, num)


def rows(results: dict[str, dict[str, object]], num: int) -> list[Row]:
    def val(name: str, key: str) -> float | None:
        return float(results[name][key]) if name in results else None  # type: ignore[arg-type]

    names = ("fleetgen", "openai-loop", "curator")
    cpu = {n: val(n, "cpu_s_per_1k") for n in names}
    rate = {n: val(n, "rate") for n in names}
    peers_cpu = [v for n, v in cpu.items() if n != "fleetgen" and v is not None]
    fg_cpu = cpu["fleetgen"] or 0.0
    cpu_ratio = min(peers_cpu) / fg_cpu if peers_cpu and fg_cpu > 0 else None
    fg_rate = rate["fleetgen"] or 0.0
    sustained = val("fleetgen", "sustained_rate") or 0.0
    server_bound = float(results["fleetgen"]["server_cores"]) >= SERVER_BOUND_CORES  # type: ignore[arg-type]
    peers_rate = [v for n, v in rate.items() if n != "fleetgen" and v is not None]
    return [
        Row(
            "driver_cost",
            f"CPU s per 1k completions ({num} × ~{OUTPUT_TOKENS} tok, c={CONCURRENCY})",
            "s",
            cpu,
            cpu_ratio,
            "best peer / fleetgen",
            "≥ 3× (aim 5×)",
            None if cpu_ratio is None else cpu_ratio >= 3,
        ),
        Row(
            "driver_cost",
            "wall rate (records / process wall, start-up included)",
            "compl/s",
            rate,
            fg_rate / max(peers_rate) if peers_rate else None,
            "fleetgen / best peer",
        ),
        Row(
            "driver_cost",
            "sustained rate (first dispatch → last completion)",
            "compl/s",
            {"fleetgen": sustained},
            target="≥ 1000/s unless server-bound",
            is_met=sustained >= 1000 or server_bound,
            note="server-bound" if server_bound else "",
        ),
        Row(
            "driver_cost",
            "server CPU during the run (sim, 1 process)",
            "cores",
            {n: val(n, "server_cores") for n in names},
        ),
        Row("driver_cost", "driver peak RSS", "MB", {n: val(n, "max_rss_mb") for n in names}),
    ]
