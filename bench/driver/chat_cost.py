"""One chat request's CPU in the driver alone: `EngineClient.chat` against the load generator, A/B by source.

    .venv/bin/python bench/driver/chat_cost.py [--src NAME=PATH ...] [--requests 4000] [--in-flight 32]
        [--repeat 5]

The load generator (`loadgen.py`, one port, answers at once: 1,800 tokens of prose as SGLang's body) runs in
its own process; each `--src` (a fleetgen `src` folder: this worktree's by default, e.g. main's checkout for
the A side) runs in a child of its own, alternating `--repeat` times, and sends `--requests` chat requests
`--in-flight` at a time through one `EngineClient` as dispatch does (a job's body). The figure: the child's
CPU (`time.process_time`: every thread) per request, after a warm-up; medians per source. Prints a line each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PAGE = REPO / "tests" / "data" / "real-engines" / "sglang-0.5.15-h200" / "mtp" / "metrics-after-chat.txt"

CHILD = """
import asyncio, json, sys, time
from fleetgen.http.client import EngineClient
url, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = {"model": "bench-model", "messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 2048,
        "temperature": 0.7}

async def send(client, num):
    for _ in range(num):
        await client.chat(body)

async def main():
    async with EngineClient(url, max_connections=k) as client:
        await asyncio.gather(*(send(client, 50 // k + 1) for _ in range(k)))  # warm-up: connections open
        t0 = time.process_time()
        await asyncio.gather(*(send(client, n // k) for _ in range(k)))
        print(json.dumps({"cpu_ms_per_request": 1000 * (time.process_time() - t0) / (n // k * k)}))

asyncio.run(main())
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", default=[], help="NAME=PATH of a fleetgen src folder")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--port", type=int, default=29311)
    args = ap.parse_args()
    srcs = dict(s.split("=", 1) for s in args.src) or {"this": str(REPO / "src")}
    argv = [sys.executable, str(HERE / "loadgen.py"), "--first-port", str(args.port), "--num", "1"]
    argv += ["--latency-s", "0", "--page", str(PAGE)]
    loadgen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ms: dict[str, list[float]] = {name: [] for name in srcs}
    try:
        assert loadgen.stdout is not None and loadgen.stdout.readline().strip() == b"ready"
        for _ in range(args.repeat):
            for name, src in srcs.items():
                child = [sys.executable, "-c", CHILD, f"http://127.0.0.1:{args.port}"]
                child += [str(args.requests), str(args.in_flight)]
                env = {**os.environ, "PYTHONPATH": src}
                done = subprocess.run(child, capture_output=True, env=env, check=True, text=True)
                ms[name].append(json.loads(done.stdout)["cpu_ms_per_request"])
                print(f"{name}: {ms[name][-1]:.3f} CPU ms a request", flush=True)
    finally:
        loadgen.terminate()
        loadgen.wait(10)
    for name, values in ms.items():
        print(f"{name}: median {statistics.median(values):.3f} CPU ms a request ({len(values)} runs)")


if __name__ == "__main__":
    main()
