"""One driver for 1,000 servers: `fleetgen run`'s CPU per completion and event-loop stall at the job's rate.

    .venv/bin/python bench/driver/run_driver.py [--endpoints 1000] [--rate 2.4] [--window-s 20] [--name NAME]
        [--loops asyncio,uvloop] [--modes off,new,old] [--repeat N] [--parts]

The load generator (`loadgen.py`, one process serving every port, or `--loadgen-procs` of them) answers as
SGLang 0.5.15 would: its real 530-line MTP /metrics page, chat completions after a latency such that
`--concurrency` requests in flight per server come back at `--rate` a second (the job's ~2.4 completions/s
per H200). The driver (`driver.py`, `run`'s own `Job` in its own process) runs once per scrape mode, side
by side against the same servers: `off` (scraped once at the start: dispatch, health and the store alone),
`new` (the fast read: only the samples fleetgen reads) and `old` (the whole page through prometheus_client,
as before: the peer), and once per event loop (`--loops`: asyncio's, the one `fleetgen run` runs on, and
uvloop's where it is installed; uvloop is no dependency of fleetgen), and once per `--src NAME=PATH` (a
fleetgen `src` folder: an A/B of two versions, e.g. main's checkout against this worktree's, labelled
`asyncio@NAME`), `--repeat` times alternating. The figure
of merit is the driver's CPU ms per completion (process CPU over the window / completions committed in it):
a busy machine stretches it less than it cuts the rate, and loops compare by its ratio. `--parts` also charges
asyncio's loop thread by part (it wraps every callback: it costs CPU, so the loops' figures are compared
without it). It prints one table and writes `bench/results/driver-<name>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

import common  # noqa: E402  (bench/common.py: records, ports, logging)

PAGE = REPO / "tests" / "data" / "real-engines" / "sglang-0.5.15-h200" / "mtp" / "metrics-after-chat.txt"
MODES = ("off", "new", "old")
LOOPS = ("asyncio", "uvloop")
TARGET_CORES = 1.0


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the architecture where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine()
    )


def free_range(num: int) -> int:
    """A first port of `num` free consecutive ports (tried from a high base)."""
    import socket

    for base in range(20000, 60000 - num, num + 7):
        socks = []
        try:
            for port in range(base, base + num):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {num} free consecutive ports")


def start_loadgen(args: argparse.Namespace, first_port: int, workdir: Path) -> list[subprocess.Popen[bytes]]:
    """The load generator's processes, each serving its share of the ports, once every port listens."""
    latency_s = args.concurrency / args.rate
    procs, share = [], -(-args.endpoints // args.loadgen_procs)
    for k in range(args.loadgen_procs):
        first, num = first_port + k * share, min(share, args.endpoints - k * share)
        argv = [sys.executable, str(HERE / "loadgen.py"), "--first-port", str(first), "--num", str(num)]
        argv += [
            "--latency-s",
            str(latency_s),
            "--answer-tokens",
            str(args.answer_tokens),
            "--page",
            str(PAGE),
        ]
        log = (workdir / f"loadgen-{k}.log").open("wb")
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log))
    for k, proc in enumerate(procs):
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            said = (workdir / f"loadgen-{k}.log").read_text()[-2000:]
            raise RuntimeError(f"the load generator did not start: {said}")
    return procs


def available_loops(asked: list[str]) -> list[str]:
    """The loops asked for that this interpreter has (uvloop is no dependency of fleetgen: a bench mode)."""
    loops = [loop for loop in asked if loop != "uvloop" or importlib.util.find_spec("uvloop") is not None]
    if len(loops) < len(asked):
        common.log("uvloop is not installed here: its driver is not run (pip install uvloop to compare)")
    return loops


def run_driver(
    args: argparse.Namespace, loop: str, mode: str, first_port: int, workdir: Path, src: tuple[str, str]
) -> dict[str, Any]:
    out_dir = workdir / f"out-{src[0]}-{loop}-{mode}"
    shutil.rmtree(out_dir, ignore_errors=True)  # a repeat starts a fresh job, as the first did
    argv = [sys.executable, str(HERE / "driver.py"), "--first-port", str(first_port), "--loop", loop]
    argv += ["--num", str(args.endpoints), "--concurrency", str(args.concurrency), "--scrape", mode]
    argv += ["--warmup-s", str(args.warmup_s), "--window-s", str(args.window_s)]
    argv += ["--input", str(workdir / "input.jsonl"), "--out-dir", str(out_dir)]
    if args.parts and loop == "asyncio":
        argv.append("--parts")
    if args.profile:
        argv += ["--profile", str(Path(args.profile).resolve().with_suffix(f".{loop}.{mode}.prof"))]
    env = {**os.environ, "PYTHONPATH": f"{src[1]}:{REPO}"}
    common.log(f"driver ({src[0]}), {loop} loop, scrape {mode}: {args.endpoints} endpoints")
    done = subprocess.run(argv, capture_output=True, env=env, timeout=args.warmup_s + args.window_s + 300)
    if done.returncode != 0:
        said = done.stderr.decode()
        raise RuntimeError(f"the driver ({mode}) failed: {said[:1500]} … {said[-1500:]}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    result["loop"] = column(loop, src[0])
    return result


def column(loop: str, src: str) -> str:
    """The column a run is reported in: its loop, and in an A/B of sources (`--src`) its source's name too
    (`asyncio@main`), so each (source, loop) has its own medians."""
    return loop if src == "this" else f"{loop}@{src}"


def parse_cost() -> dict[str, float]:
    """CPU ms per page of the real SGLang page, the fast read (`Scrape.parse`) against the whole-page parse
    (`oldscrape.old_parse`), in a child with this worktree's fleetgen: CPU time over many pages, so a busy
    machine slows it down without changing it much."""
    code = (
        "import json,sys,time; sys.path.insert(0, sys.argv[2]); import oldscrape;"
        "from fleetgen.http.metrics import Scrape; t=open(sys.argv[1]).read(); out={}\n"
        "for name, parse, n in (('new', Scrape.parse, 400), ('old', oldscrape.old_parse, 40)):\n"
        "    t0=time.process_time()\n"
        "    for _ in range(n): parse(t)\n"
        "    out[name]=1000*(time.process_time()-t0)/n\n"
        "print(json.dumps(out))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(PAGE), str(HERE)], capture_output=True, env=env, check=True
    )
    cost: dict[str, float] = json.loads(done.stdout)
    return cost


def table(results: list[dict[str, Any]]) -> str:
    parts = sorted({p for r in results for p in r["loop_cores_by_part"]})
    head = ["loop", "scrape", "ms/compl", "cores", "loop", "threads", *parts, "compl/s", "pages/s"]
    head += ["lag p50", "p99", "max ms"]
    lines = [head]
    for r in results:
        by_part = r["loop_cores_by_part"]
        lag = r["lag_ms"]
        lines.append(
            [
                r["loop"],
                r["scrape"],
                f"{r['cpu_ms_per_completion']:.3f}",
                f"{r['process_cores']:.3f}",
                f"{r['loop_cores']:.3f}" if by_part else "—",
                f"{r['other_threads_cores']:.3f}" if by_part else "—",
                *(f"{by_part.get(p, 0.0):.3f}" if by_part else "—" for p in parts),
                f"{r['completions_per_s']:,.0f}",
                f"{r['pages_parsed_per_s']:.0f}",
                *(f"{lag[q]:.1f}" if lag[q] is not None else "—" for q in ("p50", "p99")),
                f"{lag['max']:.0f}",
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in lines)


def per_completion(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each (loop, scrape)'s median driver CPU ms per completion over its repeats, and each loop's ratio to
    asyncio's at the same scrape (the figure of merit: side by side, robust to a busy machine)."""
    ms: dict[tuple[str, str], list[float]] = {}
    for r in results:
        ms.setdefault((r["loop"], r["scrape"]), []).append(r["cpu_ms_per_completion"])
    out: dict[str, dict[str, float]] = {}
    for (loop, mode), values in ms.items():
        out.setdefault(loop, {})[mode] = statistics.median(values)
    return out


def projections(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The driver's cores at the job's full rate where this machine's share of CPU did not reach it, per loop:
    CPU per completion of `off` (dispatch, health, store: everything but the scrape) × the target rate, plus
    each scrape mode's CPU per page (its cores above `off`'s, per page parsed) × its pages due."""
    out: dict[str, Any] = {"lines": []}
    target_rate = args.endpoints * args.rate
    for loop in dict.fromkeys(r["loop"] for r in results):
        by_mode = {r["scrape"]: r for r in results if r["loop"] == loop}  # the last repeat
        off = by_mode.get("off")
        if off is None or off["completions_per_s"] <= 0:
            continue
        per_completion = off["process_cores"] / off["completions_per_s"]
        mine: dict[str, float] = {"off": per_completion * target_rate}
        out["lines"].append(
            f"{loop}, off: {1000 * per_completion:.3f} CPU ms per completion → {mine['off']:.2f} cores "
            f"at {target_rate:,.0f}/s"
        )
        for mode in ("new", "old"):
            r = by_mode.get(mode)
            if r is None or r["pages_parsed_per_s"] <= 0:
                continue
            per_page = (
                r["process_cores"] - off["process_cores"] * r["completions_per_s"] / off["completions_per_s"]
            )
            per_page = max(per_page, 0.0) / r["pages_parsed_per_s"]
            pages_due = r["pages_due_per_s"]
            mine[mode] = mine["off"] + per_page * pages_due
            out["lines"].append(
                f"{loop}, {mode}: {1000 * per_page:.2f} CPU ms per page → {mine[mode]:.2f} cores at "
                f"{target_rate:,.0f}/s with {pages_due:.0f} pages/s"
            )
        out[loop] = mine
    return out


def judged(loop: str, projected: dict[str, float], results: list[dict[str, Any]]) -> dict[str, bool]:
    """One loop's verdicts: the new scrape within a core at the job's rate (projected), and no stall from it
    (judged only where the driver keeps up without scraping: its loop's p50 lag under 5 ms)."""
    verdicts = {}
    if "new" in projected:
        verdicts[
            f"{loop}, new: ≤ 1 core at the job's rate (projected at this machine's CPU per completion)"
        ] = projected["new"] <= TARGET_CORES
    by_mode = {r["scrape"]: r for r in results}
    new_p99 = by_mode.get("new", {}).get("lag_ms", {}).get("p99")
    off_p99 = by_mode.get("off", {}).get("lag_ms", {}).get("p99")
    off_p50 = by_mode.get("off", {}).get("lag_ms", {}).get("p50")
    if off_p50 is not None and off_p50 > 5.0:  # the driver's backlog, not a stall: nothing to judge by
        print(
            f"{loop}: stall not judged: without scraping the loop already lags {off_p50:.0f} ms (CPU-starved)"
        )
    elif new_p99 is not None and off_p99 is not None:
        verdicts[f"{loop}, new: scraping adds no stall (lag p99 within 2 ms of off's)"] = (
            new_p99 <= off_p99 + 2.0
        )
    return verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=2.4, help="completions per second per endpoint")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight per endpoint")
    ap.add_argument("--answer-tokens", type=int, default=1800)
    ap.add_argument("--warmup-s", type=float, default=15.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--loadgen-procs", type=int, default=1)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--loops", default=",".join(LOOPS), help="event loops to run the driver on, side by side")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every loop and mode, alternating")
    ap.add_argument("--parts", action="store_true", help="charge asyncio's loop CPU by part (it costs CPU)")
    ap.add_argument("--name", default="")
    ap.add_argument(
        "--src",
        action="append",
        default=[],
        help="NAME=PATH of a fleetgen src folder to run (A/B: each in turn); this worktree's if none",
    )
    ap.add_argument(
        "--profile", default="", help="cProfile each driver's window into PATH.<loop>.<mode>.prof"
    )
    args = ap.parse_args()
    name = args.name or f"{args.endpoints}"
    loops = available_loops(args.loops.split(","))
    srcs = [tuple(s.split("=", 1)) for s in args.src] or [("this", str(REPO / "src"))]
    with tempfile.TemporaryDirectory(prefix="fleetgen-driver-bench-") as tmp:
        workdir = Path(tmp)
        total_s = args.warmup_s + args.window_s + 10
        common.write_records(workdir / "input.jsonl", int(args.endpoints * args.rate * total_s * 1.5))
        modes = args.modes.split(",")
        runs = [(s, loop, mode) for _ in range(args.repeat) for s in srcs for loop in loops for mode in modes]
        first_port = free_range(args.endpoints)
        procs = start_loadgen(args, first_port, workdir)
        results = []
        try:
            for src, loop, mode in runs:
                results.append(run_driver(args, loop, mode, first_port, workdir, src))
                common.log(json.dumps(results[-1]))
                time.sleep(2.0)  # the servers' sockets of the last driver close
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    print(table(results))
    parse_ms = parse_cost()
    print(f"parse of the real page: new {parse_ms['new']:.2f} CPU ms, old {parse_ms['old']:.2f} CPU ms")
    ms = per_completion(results)
    for loop, by_mode in ms.items():
        base = ms.get("asyncio", {})
        print(
            f"{loop}: driver CPU ms per completion (median of {args.repeat}): "
            + ", ".join(
                f"{mode} {value:.3f}"
                + (f" ({value / base[mode]:.2f}× asyncio)" if loop != "asyncio" and base.get(mode) else "")
                for mode, value in by_mode.items()
            )
        )
    projected = projections(args, results)
    for line in projected["lines"]:
        print(line)
    verdicts = {}
    for loop in ms:
        verdicts.update(judged(loop, projected.get(loop, {}), [r for r in results if r["loop"] == loop]))
    for what, ok in verdicts.items():
        print(f"{what}: {'yes' if ok else 'NO'}")
    out = REPO / "bench" / "results" / f"driver-{name}.json"
    commit = os.environ.get("FLEETGEN_COMMIT", "")  # a copy without .git (the GPU machine's) names it so
    if not commit:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    doc = {
        "args": vars(args),
        "results": results,
        "verdicts": verdicts,
        "parse_cpu_ms_per_page": parse_ms,
        "cpu_ms_per_completion": ms,
        "projected_cores": {k: v for k, v in projected.items() if k != "lines"},
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "python": platform.python_version(),
            "load": os.getloadavg(),
        },
        "commit": commit.strip(),
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
