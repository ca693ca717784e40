"""The driver under measurement: `fleetgen run`'s own `Job` on the load generator's endpoints, in-process.

    python bench/driver/driver.py --first-port P --num N --concurrency C --scrape new|old|off \
        --warmup-s W --window-s S --input F --out-dir D [--loop asyncio|uvloop] [--parts]

The job is built as `fleetgen run -f fleet.toml` builds it (`JobOptions`, `JobServers` of an SGLang fleet, the
plain log `run` writes off a terminal), then measured over a window after a warm-up:
- CPU seconds per second of the whole process (`time.process_time`: every thread, user + sys), and per
  completion committed in the window (`cpu_ms_per_completion`: the figure of merit);
- the cyclic garbage collector's CPU per completion and its collections by generation (`gc.callbacks`);
- with `--parts` (asyncio's loop only), the event loop's thread by part: every callback the loop runs
  (`asyncio.Handle._run`) is timed with `time.thread_time` and charged to the task it steps, by the module of
  the task's coroutine (dispatch: the requests' own tasks; scrape, health, writer, progress: the ticker and
  the input's count; feed: the job's own task while it steps `Dispatcher.run`, which it awaits as no task of
  its own: picking a server, the input's next record read, parsed and judged, the request's task launched),
  or, outside any task, to `io` (socket reads: aiohttp parsing the answers and the pages) and `other`; the
  other threads (the scrape's parse, the store's commits) are the process's CPU less the loop thread's;
- the loop's stall: a task that asks to sleep 10 ms, its oversleep (p50, p99, max);
- completions committed and /metrics pages parsed in the window.
`--scrape old` runs the scraper as it was before (`oldscrape.py`: the whole page parsed on a worker
thread, every endpoint at once each interval: the peer); `off` does not scrape (an interval of 10⁹ s).
`--profile FILE` writes cProfile's stats of the window (the loop thread; it slows the driver down: for
where the time goes, not for the cores). One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import cProfile
import gc
import importlib
import json
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import oldscrape

from fleetgen.cli.runlog import PlainLog
from fleetgen.config import JobFile
from fleetgen.generate.runner import Job, JobServers
from fleetgen.generate.scrape import MAX_PAGES_PER_S
from fleetgen.generate.work import JobOptions, RecordShape, RetryPolicy, SamplingParams
from fleetgen.http.metrics import Scrape

PARTS = {  # a task's coroutine module → the part it is charged to (the first that matches)
    "bench/driver/oldscrape.py": "scrape",
    "generate/dispatch.py": "dispatch",
    "http/client.py": "dispatch",
    "generate/scrape.py": "scrape",
    "generate/health.py": "health",
    "generate/ledger/": "writer",
    "generate/runner.py": "progress",
    "bench/driver/": "probe",
}
parsed: list[float] = []  # monotonic times of the pages parsed (list.append is atomic under the GIL)


def counted(parse: Callable[[str, float], Scrape]) -> Callable[[str, float], Scrape]:
    def run(text: str, at: float = 0.0) -> Scrape:
        out = parse(text, at)
        parsed.append(time.monotonic())
        return out

    return run


FEED = ("generate/dispatch.py", "run")  # `Dispatcher.run`: pick, the input's next item, launch


def _awaits(coro: Any, where: tuple[str, str]) -> bool:
    """Whether `coro` is suspended inside the coroutine `where` (file suffix, name), at any depth."""
    while coro is not None:
        code = getattr(coro, "cr_code", None)
        if code is not None and code.co_filename.endswith(where[0]) and code.co_name == where[1]:
            return True
        coro = getattr(coro, "cr_await", None)
    return False


class CpuByPart:
    """The event loop's thread CPU per part, charged callback by callback (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._parts: dict[Any, str] = {}

    def part_of(self, callback: Any) -> str:
        owner = getattr(callback, "__self__", None)
        if not isinstance(owner, asyncio.Task):
            name = getattr(callback, "__qualname__", "")
            return "io" if "_read_ready" in name or "_write_ready" in name else "other"
        coro = owner.get_coro()
        code = getattr(coro, "cr_code", None)
        key = code.co_filename if code is not None else ""
        if key.endswith("generate/runner.py") and _awaits(coro, FEED):
            return "feed"  # the job's own task, stepping the dispatcher's loop (runner awaits it, no task)
        if (part := self._parts.get(key)) is None:
            part = next((p for where, p in PARTS.items() if where in key), "other")
            self._parts[key] = part
        return part

    def install(self) -> None:
        original = asyncio.events.Handle._run
        seconds, part_of = self.seconds, self.part_of

        def timed(handle: asyncio.events.Handle) -> None:
            t0 = time.thread_time()
            original(handle)
            seconds[part_of(handle._callback)] += time.thread_time() - t0  # type: ignore[attr-defined]

        asyncio.events.Handle._run = timed  # type: ignore[assignment,method-assign]


class GcTime:
    """CPU seconds in the cyclic garbage collector (`gc.callbacks`), and its collections by generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self.by_generation = [0.0, 0.0, 0.0]
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            spent = time.thread_time() - self._t0
            self.seconds += spent
            self.collections[info["generation"]] += 1
            self.by_generation[info["generation"]] += spent


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop to measure: asyncio's own, or uvloop's."""
    if name == "uvloop":  # measured where installed; no dependency of fleetgen (bench/README.md says why)
        uvloop = importlib.import_module("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


async def lag_probe(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - t0 - 0.01)


def lag_ms(lags: list[float]) -> dict[str, float | None]:
    """The oversleeps' p50, p99 and max (ms); a loop that woke the probe fewer than twice has no p50."""
    if len(lags) < 2:
        return {"p50": None, "p99": None, "max": 1000 * max(lags, default=0.0), "samples": len(lags)}
    cuts = statistics.quantiles(lags, n=100)
    return {"p50": 1000 * cuts[49], "p99": 1000 * cuts[98], "max": 1000 * max(lags), "samples": len(lags)}


def pages_due(args: argparse.Namespace) -> float:
    """The pages a second the scraper means to read: every endpoint each interval (the old one), or within
    the scrape's budget (`MAX_PAGES_PER_S`)."""
    if args.scrape == "off":
        return 0.0
    num, every_s = int(args.num), float(args.metrics_interval_s)
    return num / (every_s if args.scrape == "old" else max(every_s, num / MAX_PAGES_PER_S))


def job_for(args: argparse.Namespace) -> Job:
    job_file = JobFile(max_tokens=2048, concurrency=args.concurrency)
    options = JobOptions(
        input_path=args.input,
        out_dir=args.out_dir,
        params=SamplingParams.of(job_file),
        shape=RecordShape.of(job_file),
        concurrency=args.concurrency,
        # the same policy but for the fleet-down verdict: a load generator starved by this shared machine
        # times out connections at the start, which must not end the measurement (errors are reported)
        policy=RetryPolicy(max_consecutive_failures=10**9, drain_after=10**9),
        metrics_interval_s=1e9 if args.scrape == "off" else args.metrics_interval_s,
    )
    ports = range(args.first_port, args.first_port + args.num)
    endpoints = [(f"gpu{i:04d}", f"http://127.0.0.1:{port}") for i, port in enumerate(ports)]
    servers = JobServers(endpoints, describe={"fleet": {"bench": "driver"}}, engine_kind="sglang")
    return Job(options, servers)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    job = job_for(args)
    cpu, gc_time = CpuByPart(), GcTime()
    if args.parts:
        cpu.install()
    stop, lags = asyncio.Event(), list[float]()
    running = asyncio.create_task(job.run(PlainLog(lambda line: None, every_s=30.0, meanwhile=str)))
    probe = asyncio.create_task(lag_probe(lags, stop))
    await asyncio.sleep(args.warmup_s)
    profile = cProfile.Profile() if args.profile else None
    if profile is not None:
        profile.enable()
    done0, lags_at, parsed_at = job.counters.results + job.counters.errors, len(lags), len(parsed)
    wall0, cpu0, loop0 = time.monotonic(), time.process_time(), dict(cpu.seconds)
    gc0, collections0, by_gen0 = gc_time.seconds, list(gc_time.collections), list(gc_time.by_generation)
    await asyncio.sleep(args.window_s)
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    wall = time.monotonic() - wall0
    process_s = time.process_time() - cpu0
    gc_s = gc_time.seconds - gc0
    collections = [n - n0 for n, n0 in zip(gc_time.collections, collections0, strict=True)]
    loop_s = {part: (s - loop0.get(part, 0.0)) / wall for part, s in cpu.seconds.items()}
    done = job.counters.results + job.counters.errors - done0
    window_lags = lags[lags_at:]
    pages = len(parsed) - parsed_at
    stop.set()
    job.stop()
    job.stop()  # abandon what is in flight: the window is measured
    summary = await running
    await probe
    loop_total = sum(loop_s.values())
    done_s = max(done, 1)
    return {
        "scrape": args.scrape,
        "loop": args.loop,
        "cpu_ms_per_completion": 1000 * process_s / done_s,
        "gc_ms_per_completion": 1000 * gc_s / done_s,
        "gc_collections": collections,
        "gc_ms_by_generation": [
            1000 * (s - s0) for s, s0 in zip(gc_time.by_generation, by_gen0, strict=True)
        ],
        "endpoints": args.num,
        "window_s": wall,
        "process_cores": process_s / wall,
        "loop_cores": loop_total,
        "other_threads_cores": process_s / wall - loop_total,
        "loop_cores_by_part": dict(sorted(loop_s.items(), key=lambda kv: -kv[1])),
        "completions_per_s": done / wall,
        "pages_parsed_per_s": pages / wall,
        "pages_due_per_s": pages_due(args),
        "lag_ms": lag_ms(window_lags),
        "errors": job.counters.errors,
        "status": summary.status,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-port", type=int, required=True)
    ap.add_argument("--num", type=int, required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--scrape", choices=("new", "old", "off"), required=True)
    ap.add_argument("--metrics-interval-s", type=float, default=JobOptions.metrics_interval_s)
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--profile", type=Path, help="cProfile the window (slows it down) into this file")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument(
        "--parts", action="store_true", help="charge the loop's CPU by part (asyncio only; costs)"
    )
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.scrape == "old":
        oldscrape.install(counted(oldscrape.old_parse))
    else:
        Scrape.parse = staticmethod(counted(Scrape.parse))  # type: ignore[assignment,method-assign]
    if args.parts and args.loop != "asyncio":
        ap.error("--parts times asyncio's own callbacks: it needs --loop asyncio")
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        print(json.dumps(runner.run(measure(args))), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
