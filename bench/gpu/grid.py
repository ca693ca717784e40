"""The wide grid, run once on a GPU host: each SGLang setting launched alone, driven with a job-shaped load,
its steady-state output tok/s read off the engine's own counters (not fleetgen's: this is the yardstick
`tune` is judged by).

    python bench/gpu/grid.py --model DIR --out DIR --settings NAME[,NAME…] [--window 60] [--python PY]

Each setting: launch `sglang.launch_server` (its own process tree, marked by an env var so the stop finds the
scheduler, which runs in its own session), wait for health, read the admitted cap
(`/get_server_info` → `internal_states[0].effective_max_running_requests_per_dp`), then drive it:
- the job's shape: short prompts (random token ids, 100–400), output lengths drawn from a lognormal with mean
  ~1,800 truncated to [300, 6,000], sent with `ignore_eos` (dummy weights choose no lengths of their own);
- **an equilibrium start**: the first request of each client slot carries an age — its prompt is padded by the
  tokens a request of the stationary mix would already hold, and it asks only the rest of its length — so the
  batch's KV and attention cost look like the job's steady state from the first minute, not after the longest
  request has cycled (~6,000 tokens at 20–50 ms a step: 2–5 minutes);
- clients = the admitted cap × 1.3 + 8 (a queue keeps the batch full, SGLang's tuning guide);
then, after a warm-up (the batch full, or 60 s), a fixed window: Δ `sglang:generation_tokens_total` / Δt, with
the running/queued gauges sampled every 2 s. One JSON per setting under OUT, and `grid.json` with all.
Runs where no package index is reachable: standard library + aiohttp only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

MARK = "FLEETGEN_GRID_SERVER"
PORT = 31000
COMMON = [
    "--load-format",
    "dummy",
    "--context-length",
    "8192",
    "--attention-backend",
    "fa3",
    "--sampling-backend",
    "pytorch",
    "--mm-attention-backend",
    "triton_attn",
    "--enable-metrics",
    "--host",
    "127.0.0.1",
    "--port",
    str(PORT),
    "--mem-fraction-static",
    "0.85",
]
MTP = [
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]
NO_RADIX = ["--disable-radix-cache", "--mamba-radix-cache-strategy", "no_buffer"]
ACC3 = {"SGLANG_SIMULATE_ACC_LEN": "3.0"}


def mrr(n: int) -> list[str]:
    return ["--max-running-requests", str(n), "--cuda-graph-max-bs", str(n)]


SETTINGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "defaults": ([], {}),
    "noradix-256": ([*NO_RADIX, *mrr(256)], {}),
    "noradix-192": ([*NO_RADIX, *mrr(192)], {}),
    "noradix-320-mf90": ([*NO_RADIX, *mrr(320), "--mem-fraction-static", "0.90"], {}),
    "noradix-288-mf92-replay": (
        [*NO_RADIX, *mrr(288), "--mem-fraction-static", "0.92", "--enable-linear-replayssm"],
        {},
    ),
    "noradix-256-replay": ([*NO_RADIX, *mrr(256), "--enable-linear-replayssm"], {}),
    "noradix-256-mf90": ([*NO_RADIX, *mrr(256), "--mem-fraction-static", "0.90"], {}),
    "mtp-defaults-acc3": ([*MTP, "--mamba-radix-cache-strategy", "extra_buffer"], ACC3),
    "mtp-noradix-64-acc3": ([*MTP, *NO_RADIX, *mrr(64)], ACC3),
    "mtp-noradix-96-acc3": ([*MTP, *NO_RADIX, *mrr(96)], ACC3),
}


@dataclass
class Lengths:
    """Output lengths: a lognormal (σ = 0.8) truncated to [lo, hi]; `mean` is the untruncated one (2,040 gives
    ~1,800 after the truncation)."""

    mean: float = 2040.0
    lo: int = 300
    hi: int = 6000
    sigma: float = 0.8

    def draw(self, rng: random.Random) -> int:
        mu = math.log(self.mean) - self.sigma**2 / 2
        while True:
            x = int(rng.lognormvariate(mu, self.sigma))
            if self.lo <= x <= self.hi:
                return x

    def aged(self, rng: random.Random) -> tuple[int, int]:
        """(age, rest) of a request met in the stationary mix: its length is length-biased (accept a draw with
        probability L / hi), its age uniform over it."""
        while True:
            length = self.draw(rng)
            if rng.random() < length / self.hi:
                age = int(rng.random() * length)
                return age, max(length - age, 1)


@dataclass
class Result:
    setting: str
    args: list[str]
    env: dict[str, str]
    started: bool = False
    startup_s: float = 0.0
    admitted: int | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    window_s: float = 0.0
    # the engine's decode rate (`sglang:gen_throughput`, sampled) over the window: what decides the job's time
    decode_tok_s: float = 0.0
    # Δ generation_tokens_total / Δt: SGLang 0.5.15 counts a request's tokens when it *finishes*, so a short
    # window right after an equilibrium start reads low (the first to finish are the short residuals)
    output_tok_s: float = 0.0
    completions: int = 0
    running_mean: float = 0.0
    queued_mean: float = 0.0
    token_usage_max: float = 0.0
    accept_length: float | None = None
    samples: list[dict[str, float]] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    error: str = ""


def gauge(text: str, name: str) -> float | None:
    """Sum of a metric's samples in Prometheus text (`name{…} value` or `name value`)."""
    total, seen = 0.0, False
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M):
        total, seen = total + float(m.group(1)), True
    return total if seen else None


async def metrics(s: aiohttp.ClientSession, base: str) -> dict[str, float | None]:
    async with s.get(f"{base}/metrics") as r:
        text = await r.text()
    names = {
        "gen": "sglang:generation_tokens_total",
        "running": "sglang:num_running_reqs",
        "queued": "sglang:num_queue_reqs",
        "usage": "sglang:token_usage",
        "accept": "sglang:spec_accept_length",
        "decode": "sglang:gen_throughput",  # the scheduler's rate over its last decode-log interval
    }
    return {k: gauge(text, n) for k, n in names.items()}


def stop_servers() -> None:
    """Every process carrying the mark (the launcher, its scheduler in its own session, detokenizer), then
    wait for the GPU's memory to come back."""
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"{MARK}=1".encode() in env.split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for _ in range(60):
        used = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if used and int(used[0]) < 2000:
            return
        time.sleep(1)


async def wait_ready(base: str, proc: subprocess.Popen[bytes], limit_s: float) -> None:
    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - start < limit_s:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            try:
                async with s.get(f"{base}/health_generate", timeout=aiohttp.ClientTimeout(total=30)) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(2)
    raise RuntimeError(f"not ready after {limit_s:.0f} s")


async def client(
    s: aiohttp.ClientSession, base: str, rng: random.Random, lengths: Lengths, aged: bool, done: list[float]
) -> None:
    """One client slot: its first request aged (equilibrium start) if asked, then fresh ones, forever."""
    first = aged
    while True:
        prompt = rng.randint(100, 400)
        age, rest = lengths.aged(rng) if first else (0, lengths.draw(rng))
        first = False
        body = {
            "input_ids": [rng.randint(1000, 100_000) for _ in range(prompt + age)],
            "sampling_params": {
                "max_new_tokens": rest,
                "ignore_eos": True,
                "temperature": 0.6,
                "top_p": 0.95,
            },
        }
        try:
            async with s.post(f"{base}/generate", json=body) as r:
                await r.read()
                if r.status == 200:
                    done.append(time.monotonic())
        except aiohttp.ClientError:
            await asyncio.sleep(1)


async def measure(res: Result, base: str, window: float, warm_max: float, seed: int) -> None:
    lengths, rng = Lengths(), random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as s:
        async with s.get(f"{base}/get_server_info") as r:
            info = await r.json()
        states = info.get("internal_states") or [{}]
        res.admitted = states[0].get("effective_max_running_requests_per_dp") or info.get(
            "max_running_requests"
        )
        res.server_info = {k: v for k, v in info.items() if not isinstance(v, dict | list)}
        cap = int(res.admitted or 64)
        slots = int(cap * 1.3) + 8
        done: list[float] = []
        tasks = [
            asyncio.create_task(client(s, base, random.Random(rng.random()), lengths, i < cap, done))
            for i in range(slots)
        ]
        t0 = time.monotonic()
        while time.monotonic() - t0 < warm_max:
            m = await metrics(s, base)
            if (m["running"] or 0) >= 0.95 * cap and time.monotonic() - t0 > 20:
                break
            await asyncio.sleep(2)
        await asyncio.sleep(10)
        first = await metrics(s, base)
        ts = time.monotonic()
        n0 = len(done)
        while time.monotonic() - ts < window:
            await asyncio.sleep(2)
            m = await metrics(s, base)
            res.samples.append({"t": time.monotonic() - ts, **{k: v or 0.0 for k, v in m.items()}})
        last = await metrics(s, base)
        res.window_s = time.monotonic() - ts
        res.output_tok_s = ((last["gen"] or 0) - (first["gen"] or 0)) / res.window_s
        res.completions = len(done) - n0
        res.decode_tok_s = sum(x["decode"] for x in res.samples) / len(res.samples)
        res.running_mean = sum(x["running"] for x in res.samples) / len(res.samples)
        res.queued_mean = sum(x["queued"] for x in res.samples) / len(res.samples)
        res.token_usage_max = max(x["usage"] for x in res.samples)
        res.accept_length = last["accept"]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


KEEP = re.compile(
    r"KV Cache is allocated|max_running_requests|mamba|Mamba|reduced from|Capture cuda graph|memory|"
    r"accept len|#running-req|Traceback|Error|error"
)


def run_setting(name: str, a: argparse.Namespace) -> Result:
    args, env_extra = SETTINGS[name]
    res = Result(name, args, env_extra)
    log = a.out / f"{name}.log"
    argv = [a.python, "-m", "sglang.launch_server", "--model-path", str(a.model), *COMMON, *args]
    env = {**os.environ, **env_extra, MARK: "1"}
    t0 = time.monotonic()
    with log.open("wb") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{PORT}"
    try:
        asyncio.run(wait_ready(base, proc, a.start_timeout))
        res.started, res.startup_s = True, time.monotonic() - t0
        asyncio.run(measure(res, base, a.window, a.warm_max, a.seed))
    except Exception as exc:  # a setting that fails is a result, and the grid goes on
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        stop_servers()
    lines = log.read_text(errors="replace").splitlines()
    res.log_lines = [x[-300:] for x in lines if KEEP.search(x)][-80:]
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--settings", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--warm-max", type=float, default=60.0)
    p.add_argument("--start-timeout", type=float, default=420.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    stop_servers()
    results = []
    for name in a.settings.split(","):
        print(f"[grid] {name}: start", flush=True)
        res = run_setting(name, a)
        results.append(asdict(res))
        (a.out / f"{name}.json").write_text(json.dumps(asdict(res), indent=1))
        print(
            f"[grid] {name}: admitted {res.admitted} running {res.running_mean:.0f} queued "
            f"{res.queued_mean:.0f} decode {res.decode_tok_s:,.0f} tok/s (finished {res.output_tok_s:,.0f}) "
            f"startup {res.startup_s:.0f} s {res.error}",
            flush=True,
        )
    (a.out / "grid.json").write_text(json.dumps(results, indent=1))
    print("[grid] done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
