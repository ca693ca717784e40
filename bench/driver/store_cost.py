"""The store's CPU per result row alone: `Store.write_batch` of the writer's batches, A/B by source.

    .venv/bin/python bench/driver/store_cost.py [--src NAME=PATH ...] [--rows 36] [--batches 100] [--repeat 5]

Each `--src` (a fleetgen `src` folder: this worktree's by default, e.g. main's checkout for the A side) runs
in a child of its own, alternating `--repeat` times: a fresh store, `--batches` batches of `--rows` new result
rows each (36: the writer's batch at 360 completions a second, one each 0.1 s; an answer of 1,800 tokens of
text, built by `rows.RowBuilder` as `run` builds them) with the resume position's meta item. The figure: the
child's CPU (`time.process_time`) per row over the writes, with `synchronous = OFF` (the statements' CPU,
not the disk's fsync wait). Prints a line each run and the medians per source.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

CHILD = """
import json, sys, tempfile, time
from pathlib import Path
from fleetgen.generate import rows
from fleetgen.generate.ledger.store import Batch, Store
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import Completion
per, num = int(sys.argv[1]), int(sys.argv[2])
text = "word " * 1440

def row(i):
    prompt = [[{"role": "user", "content": "q" * 500}]]
    work = Work(Record(f"r{i}", "in.jsonl", i, 0, prompt, content_hash=5), 0)
    work.done.append(Completion(text[:1800], text, "stop", 20, 1800))
    return rows.RowBuilder("m", "h").result("s0", work, 0.0, 0.1)

batches = [
    Batch(results=[row(b * per + i) for i in range(per)], meta={"position": str(b)}) for b in range(num)
]
with tempfile.TemporaryDirectory() as folder:
    store = Store.open(Path(folder))
    store.conn.execute("PRAGMA synchronous = OFF")
    t0 = time.process_time()
    for batch in batches:
        store.write_batch(batch)
    print(json.dumps({"cpu_ms_per_row": 1000 * (time.process_time() - t0) / (per * num)}))
    store.close()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", default=[], help="NAME=PATH of a fleetgen src folder")
    ap.add_argument("--rows", type=int, default=36)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    srcs = dict(s.split("=", 1) for s in args.src) or {"this": str(REPO / "src")}
    ms: dict[str, list[float]] = {name: [] for name in srcs}
    for _ in range(args.repeat):
        for name, src in srcs.items():
            child = [sys.executable, "-c", CHILD, str(args.rows), str(args.batches)]
            env = {**os.environ, "PYTHONPATH": src}
            done = subprocess.run(child, capture_output=True, env=env, check=True, text=True)
            ms[name].append(json.loads(done.stdout)["cpu_ms_per_row"])
            print(f"{name}: {ms[name][-1]:.4f} CPU ms a row", flush=True)
    for name, values in ms.items():
        print(f"{name}: median {statistics.median(values):.4f} CPU ms a row ({len(values)} runs)")


if __name__ == "__main__":
    main()
