"""The whole story on a GPU host with an installed engine, for one fleet file — rerunnable by anyone.

    python scripts/gpu_scenario.py -f fleet.toml --out DIR [--prompts 512] [--concurrency 64]

For the fleet file as written (spec decoding on, when it has it) and then for the same fleet without
speculative decoding: `hosts check` → `plan` (online) → `up` → `status` → `run` (N prompts, thinking on,
fixed output length) → `export` (sharegpt, checked) → the engine's own bench client on the same prompts, same
concurrency, same server → `bench` (concurrency sweep) — then `down` (GPU memory back to 0). It writes
DIR/gpu-<engine>-<version>-<gpu>.json (planned vs actual capacity, fleetgen vs the engine's bench client,
the sweep's peak vs the plan's max running requests, spec on vs off) and a markdown table beside it; every
command's output and the engine's raw words (log, /metrics, server info, nvidia-smi) land in DIR/raw/.
A failing step is recorded and the story goes on with the server that is up (the raw capture matters most).

`--variants spec` / `nospec` and `--steps` run a part (a machine lent 10 minutes per command); the state
of the steps done is kept in DIR, so `--steps report` (or the last part) writes the result from every part.
This script needs a GPU and a real engine; it is never a test. `scripts/airgap_prepare.py` makes the bundle.
"""

from __future__ import annotations

import argparse
import calendar
import itertools
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

# The sweep runs before the measured pair: a fresh server pays one-time costs (kernel compilation and
# autotuning on its first big batches: 100 s on SGLang MTP, H200) and the pair must meet a warm server. The
# sweep samples as the job does (`bench --job`: vLLM 0.24 JIT-compiles its top-k/top-p kernel on the first
# top_p request, a 5 s stall that fell inside fleetgen's measured run while the sweep sampled greedily), and
# `warm` then sends one wave through `run` itself, on prompts of the measured run's shape.
STEPS = [
    "check",
    "plan",
    "up",
    "status",
    "capture",
    "sweep",
    "warm",
    "run",
    "export",
    "engine_bench",
    "down",
    "report",
]
FLEETGEN = [
    sys.executable,
    "-c",
    "import sys; sys.argv[0] = 'fleetgen'; from fleetgen.cli import main; main()",
]


class Scenario:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out: Path = a.out.resolve()
        self.raw = self.out / "raw"
        self.raw.mkdir(parents=True, exist_ok=True)
        self.state_path = self.out / "state.json"
        self.state: dict[str, Any] = (
            json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        )
        self.fleet_path: Path = a.fleet.resolve()
        self.fleet = tomllib.loads(self.fleet_path.read_text())
        self.engine: dict[str, Any] = self.fleet["engine"]

    # ---- plumbing -------------------------------------------------------------------------------------
    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=1, default=str))

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        with (self.out / "scenario.log").open("a") as f:
            f.write(line + "\n")

    def sh(
        self, name: str, argv: list[str], timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run argv, its output to raw/<name>.txt; never raises: the rc and the time are the record."""
        self.log(f"$ {name}: {' '.join(argv[:12])}{' …' if len(argv) > 12 else ''}")
        t0 = time.monotonic()
        path = self.raw / f"{name}.txt"
        with path.open("w") as f:
            try:
                rc = subprocess.run(
                    argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        wall = time.monotonic() - t0
        self.log(f"  rc={rc} in {wall:.1f} s")
        end = time.time()
        return {
            "rc": rc,
            "wall_s": round(wall, 2),
            "output": str(path.relative_to(self.out)),
            "t0": round(end - wall, 3),
            "t1": round(end, 3),
        }

    def fg(self, name: str, args: list[str], timeout: float = 600) -> dict[str, Any]:
        return self.sh(name, [*FLEETGEN, *args], timeout)

    def text(self, rec: dict[str, Any]) -> str:
        return (self.out / str(rec["output"])).read_text(errors="replace")

    def json_of(self, rec: dict[str, Any]) -> Any:
        """The last JSON document in a command's output (fleetgen prints warnings before it)."""
        text = self.text(rec)
        for start in [m.start() for m in re.finditer(r"^[\[{]", text, re.M)]:
            try:
                return json.loads(text[start:])
            except json.JSONDecodeError:
                continue
        return None

    def url(self, variant: str) -> str:
        st = self.state.get(variant, {}).get("status_json") or []
        if st and st[0].get("url"):
            return str(st[0]["url"]).rstrip("/")
        return f"http://127.0.0.1:{self.engine.get('base_port', 30000)}"

    def engine_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({k: str(v) for k, v in self.engine.get("env", {}).items()})
        return env

    # ---- inputs -----------------------------------------------------------------------------------------
    def prompts(self) -> Path:
        """N distinct prompts of ~input_len tokens of the model's own tokenizer, in three files with the same
        texts: fleetgen's JSONL, vLLM bench's custom JSONL and SGLang bench_serving's ShareGPT JSON."""
        path = self.out / "prompts.jsonl"
        if path.exists():
            return path
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(self.engine["model"]) / "tokenizer.json"))
        rng = random.Random(7)
        vocab = sorted(t for t in tok.get_vocab() if t.lstrip("Ġ").isalpha() and 2 <= len(t) <= 8)[:20000]
        texts = []
        for _ in range(self.a.prompts):
            ids = tok.encode(" ".join(rng.choices(vocab, k=self.a.input_len * 2))).ids[: self.a.input_len]
            texts.append(tok.decode(ids).replace("Ġ", " ").strip())
        with path.open("w") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": f"p{i}", "prompt": t}) + "\n")
        with (self.out / "prompts-vllm-custom.jsonl").open("w") as f:
            for t in texts:
                f.write(json.dumps({"prompt": t}) + "\n")
        pad = "x " * self.a.output_len  # sharegpt rows need a reply; --sharegpt-output-len sets the length
        rows = [
            {"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": pad}]} for t in texts
        ]
        (self.out / "prompts-sharegpt.json").write_text(json.dumps(rows))
        return path

    def job(self) -> Path:
        path = self.out / "job.toml"
        path.write_text(
            f"max_tokens = {self.a.output_len}\ntemperature = {self.a.temperature}\ntop_p = {self.a.top_p}\n"
            "thinking = true\nextra_body = { ignore_eos = true }\n"
        )
        return path

    def variants(self) -> dict[str, Path]:
        """spec: the fleet file as written; nospec: without its speculative args (bench's own rewrite)."""
        from fleetgen.bench.fleet import write_spec_off
        from fleetgen.deploy.fleet_ref import Fleet
        from fleetgen.errors import FleetgenError

        off = self.fleet_path.with_name(self.fleet_path.stem + "-nospec.toml")
        try:
            written = write_spec_off(Fleet.load(self.fleet_path)).path
        except FleetgenError:
            return {"nospec": self.fleet_path}
        shutil.move(written, off)
        return {"spec": self.fleet_path, "nospec": off}

    # ---- steps ------------------------------------------------------------------------------------------
    def step_check(self, v: str, fleet: Path) -> None:
        rec = self.fg(f"{v}-hosts-check", ["hosts", "check", "-f", str(fleet), "--json"], 300)
        self.state[v]["check"] = {**rec, "json": self.json_of(rec)}

    def step_plan(self, v: str, fleet: Path) -> None:
        rec = self.fg(f"{v}-plan", ["plan", "-f", str(fleet), "--json"], 600)
        self.state[v]["plan"] = {**rec, "json": self.json_of(rec)}

    def step_up(self, v: str, fleet: Path) -> None:
        self.state[v]["up"] = self.fg(f"{v}-up", ["up", "-f", str(fleet)], self.a.up_timeout)

    def step_capture(self, v: str, fleet: Path) -> None:
        """The engine's own words, whatever fleetgen's verdict: log, /metrics, server info, models, GPU."""
        name = f"{self.fleet['hosts'][0]['name']}-0"  # the first instance (fleetgen's naming: host-index)
        self.fg(f"{v}-engine-log", ["logs", name, "--fleet", str(fleet), "-n", "4000"], 120)
        url = self.url(v)
        got: dict[str, int | str] = {}  # route → body length, or why it failed
        for name, path in [
            ("metrics", "/metrics"),
            ("server_info", "/get_server_info"),
            ("server_info2", "/server_info"),
            ("models", "/v1/models"),
        ]:
            try:
                with urllib.request.urlopen(url + path, timeout=30) as r:
                    body = r.read().decode(errors="replace")
                (self.raw / f"{v}-{name}.txt").write_text(body)
                got[name] = len(body)
            except Exception as exc:  # recorded, not fatal: an engine may lack the route
                got[name] = f"{type(exc).__name__}: {exc}"
        self.state[v]["capture"] = got
        self.state[v]["nvidia_smi_up"] = self.gpu_used(f"{v}-nvidia-smi-up")
        self.state["gpu"] = self.state.get("gpu") or self.gpu_name()
        self.state[v]["actual"] = self.actual(v)

    def step_status(self, v: str, fleet: Path) -> None:
        rec = self.fg(f"{v}-status", ["status", "-f", str(fleet), "--json"], 120)
        self.state[v]["status"] = rec
        self.state[v]["status_json"] = self.json_of(rec)

    def target_args(self, v: str, fleet: Path) -> list[str]:
        """-f FLEET when `up` verified the server; else its URL (the story goes on with the server up)."""
        if self.state[v].get("up", {}).get("rc") == 0:
            return ["-f", str(fleet)]
        return ["--endpoint", self.url(v)]

    def step_run(self, v: str, fleet: Path) -> None:
        out = self.out / f"run-{v}"
        shutil.rmtree(out, ignore_errors=True)
        args = [
            "run",
            str(self.prompts()),
            "-o",
            str(out),
            *self.target_args(v, fleet),
            "--job",
            str(self.job()),
            "--concurrency",
            str(self.a.concurrency),
            "--json",
            "--no-live",
        ]
        rec = self.fg(f"{v}-run", args, 900)
        summary = self.json_of(rec)
        window = None
        if (out / "results.sqlite").exists():
            with sqlite3.connect(out / "results.sqlite") as db:
                first, last, tokens, n = db.execute(
                    "SELECT min(started_at), max(finished_at), sum(completion_tokens), count(*) FROM results"
                ).fetchone()
            if n:
                window = {
                    "duration_s": last - first,
                    "output_tokens": tokens,
                    "completed": n,
                    "output_tok_s": tokens / (last - first),
                }
        self.state[v]["run"] = {**rec, "summary": summary, "window": window}

    def step_warm(self, v: str, fleet: Path) -> None:
        """One unmeasured wave (`concurrency` requests) with the job's sampling, on prompts that share no
        prefix with the measured ones, so that the measured pair meets an equally warm server."""
        warm = self.out / "prompts-warm.jsonl"
        with self.prompts().open() as src, warm.open("w") as dst:
            for line in itertools.islice(src, self.a.concurrency):
                rec = json.loads(line)
                dst.write(
                    json.dumps({"id": f"warm-{rec['id']}", "prompt": "Warm-up. " + rec["prompt"]}) + "\n"
                )
        out = self.out / f"warm-{v}"
        shutil.rmtree(out, ignore_errors=True)
        args = ["run", str(warm), "-o", str(out), *self.target_args(v, fleet), "--job", str(self.job())]
        rec = self.fg(
            f"{v}-warm", [*args, "--concurrency", str(self.a.concurrency), "--json", "--no-live"], 600
        )
        self.state[v]["warm"] = {k: rec[k] for k in ("rc", "wall_s") if k in rec}

    def step_export(self, v: str, fleet: Path) -> None:
        to = self.raw / f"{v}-sharegpt.jsonl"
        rec = self.fg(
            f"{v}-export",
            [
                "export",
                str(self.out / f"run-{v}"),
                "--format",
                "sharegpt",
                "--inline-think",
                "--to",
                str(to),
                "--json",
            ],
            300,
        )
        self.state[v]["export"] = {**rec, "check": check_sharegpt(to, self.a.prompts)}
        if to.exists() and to.stat().st_size > 4 << 20:  # keep a sample; the whole file is in the run folder
            lines = to.read_text().splitlines()[:20]
            to.write_text("\n".join(lines) + "\n")

    def step_engine_bench(self, v: str, fleet: Path) -> None:
        """The engine's own benchmark client: same prompts, concurrency, lengths, sampling, server."""
        self.prompts()
        kind, py, url, a = self.engine["kind"], self.engine["python"], self.url(v), self.a
        name = self.engine.get("served_model_name") or self.engine["model"]
        sampling = {"temperature": a.temperature, "top_p": a.top_p}
        if kind == "vllm":
            result = self.raw / f"{v}-vllm-bench.json"
            argv = [
                py,
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
                name,
                "--tokenizer",
                self.engine["model"],
                "--dataset-name",
                "custom",
                "--dataset-path",
                str(self.out / "prompts-vllm-custom.jsonl"),
                "--skip-chat-template",
                "--custom-output-len",
                str(a.output_len),
                "--num-prompts",
                str(a.prompts),
                "--max-concurrency",
                str(a.concurrency),
                "--ignore-eos",
                "--temperature",
                str(a.temperature),
                "--top-p",
                str(a.top_p),
                "--disable-tqdm",
                "--save-result",
                "--result-dir",
                str(self.raw),
                "--result-filename",
                result.name,
            ]
        else:
            result = self.raw / f"{v}-sglang-bench.jsonl"
            result.unlink(missing_ok=True)
            argv = [
                py,
                "-m",
                "sglang.bench_serving",
                "--backend",
                "sglang-oai-chat",
                "--base-url",
                url,
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                str(self.out / "prompts-sharegpt.json"),
                "--sharegpt-output-len",
                str(a.output_len),
                "--num-prompts",
                str(a.prompts),
                "--max-concurrency",
                str(a.concurrency),
                "--model",
                self.engine["model"],
                "--served-model-name",
                name,
                "--tokenizer",
                self.engine["model"],
                "--extra-request-body",
                json.dumps(sampling),
                "--disable-tqdm",
                "--output-file",
                str(result),
            ]
        rec = self.sh(f"{v}-engine-bench", argv, 900, env=self.engine_env())
        name = f"{self.fleet['hosts'][0]['name']}-0"
        self.fg(f"{v}-engine-log-end", ["logs", name, "--fleet", str(fleet), "-n", "100000"], 120)
        doc = None
        if result.exists():
            text = result.read_text().strip().splitlines()
            doc = json.loads(text[-1]) if text else None
        keys = (
            "output_throughput",
            "duration",
            "completed",
            "total_output_tokens",
            "total_output",
            "mean_ttft_ms",
            "mean_tpot_ms",
            "max_concurrency",
        )
        self.state[v]["engine_bench"] = {**rec, "result": {k: doc[k] for k in keys if doc and k in doc}}

    def step_sweep(self, v: str, fleet: Path) -> None:
        args = [
            "bench",
            *self.target_args(v, fleet),
            "--input-len",
            str(self.a.input_len),
            "--output-len",
            str(self.a.output_len),
            "-c",
            self.a.levels,
            "--rounds",
            str(self.a.rounds),
            "--scope",
            "instances",
            "--job",
            str(self.job()),
            "--json",
        ]
        rec = self.fg(f"{v}-bench-sweep", args, 900)
        self.state[v]["sweep"] = {**rec, "json": self.json_of(rec)}

    def step_down(self, v: str, fleet: Path) -> None:
        rec = self.fg(f"{v}-down", ["down", "-f", str(fleet)], 300)
        used = None
        for _ in range(30):  # the driver frees memory a moment after the process is gone
            used = self.gpu_used(f"{v}-nvidia-smi-down")
            if not used or not any(used):
                break
            time.sleep(2)
        self.state[v]["down"] = {**rec, "gpu_used_mib_after": used}

    def switch(self, prev: str, fleet: Path) -> None:
        """Before the next variant's `up`: stop the previous server (its GPU memory after `down` recorded, as
        the last variant's), also one `up` did not record."""
        self.step_down(prev, fleet)
        port = int(self.url(prev).rsplit(":", 1)[1].split("/")[0])
        try:
            import psutil

            pids = {
                c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.pid
            }
            for pid in pids:
                self.log(f"port {port} still held by pid {pid}: stopping its process group")
                os.killpg(os.getpgid(pid), 15)
            for _ in range(60):
                if not any(c.laddr and c.laddr.port == port for c in psutil.net_connections("tcp")):
                    break
                time.sleep(1)
        except ImportError:
            pass

    # ---- readings ---------------------------------------------------------------------------------------
    def gpu_used(self, name: str) -> list[int] | None:
        if shutil.which("nvidia-smi") is None:
            return None
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        )
        full = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
        (self.raw / f"{name}.txt").write_text(full.stdout)
        return [int(x) for x in q.stdout.split()] if q.returncode == 0 else None

    def actual(self, v: str) -> dict[str, Any]:
        """Capacity as the engine reports it: SGLang's server info, vLLM's startup log lines."""
        from fleetgen.engines import get_engine

        engine = get_engine(self.engine["kind"])
        got: dict[str, Any] = {}
        log = self.raw / f"{v}-engine-log.txt"
        text = log.read_text(errors="replace") if log.exists() else ""
        for info_path in (self.raw / f"{v}-server_info.txt", self.raw / f"{v}-server_info2.txt"):
            if not info_path.exists() or "kv_tokens" in got:
                continue
            try:
                info = json.loads(info_path.read_text())
                got["kv_tokens"] = info.get("max_total_num_tokens")
                got["max_running_requests"] = engine.max_running_from_info(info)
                got["max_running_requests_arg"] = info.get("max_running_requests")
            except json.JSONDecodeError:
                pass
        patterns = {
            "kv_tokens_log": r"[GC]PU KV cache size: ([\d,]+) tokens",
            "max_concurrency_x": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
            "kv_cache_gib_log": r"Available KV cache memory: ([\d.]+) GiB",
            "mamba_slots": r"max_mamba_cache_size: (\d+)",
            "max_running_log": r"max_running_requests=(\d+)",
            "max_total_num_tokens_log": r"max_total_num_tokens=(\d+)",
            "weights_gib_log": r"(?:Model loading took|weight, avail mem=.*?mem usage=) ?([\d.]+) ?G",
        }
        for key, pat in patterns.items():
            found = re.findall(pat, text)
            if found:
                got[key] = [float(x.replace(",", "")) for x in found]
        return got

    # ---- the result -------------------------------------------------------------------------------------
    def report(self) -> Path:
        st = self.state
        rows: dict[str, dict[Any, Any]] = {}  # variant → its row; "spec_vs_nospec" → concurrency → ratio
        for v in ("spec", "nospec"):
            if v not in st:
                continue
            s = st[v]
            plan_inst = ((s.get("plan") or {}).get("json") or {}).get("instances") or [{}]
            planned = {
                k: plan_inst[0].get(k)
                for k in (
                    "kv_tokens",
                    "mamba_slots",
                    "max_running_requests",
                    "weights_bytes",
                    "spec_scratch_bytes",
                )
            }
            fg_run = (s.get("run") or {}).get("window") or {}
            summary = (s.get("run") or {}).get("summary") or {}
            eb = (s.get("engine_bench") or {}).get("result") or {}
            levels = ((s.get("sweep") or {}).get("json") or {}).get("levels") or []
            peak = max(levels, key=lambda r: r.get("output_tok_s") or 0, default=None)
            ratio = (
                (fg_run.get("output_tok_s") or 0) / eb["output_throughput"]
                if eb.get("output_throughput")
                else None
            )
            rows[v] = {
                "planned": planned,
                "actual": s.get("actual"),
                "up_rc": (s.get("up") or {}).get("rc"),
                "up_wall_s": (s.get("up") or {}).get("wall_s"),
                "fleetgen_run": {
                    "window": fg_run,
                    "summary_elapsed_s": summary.get("elapsed_s"),
                    "summary_output_tokens": summary.get("output_tokens_this_run"),
                    "errors": summary.get("errors_this_run"),
                },
                "engine_bench": eb,
                "fleetgen_over_engine_bench": ratio,
                "sweep": [
                    {
                        k: r.get(k)
                        for k in (
                            "concurrency",
                            "output_tok_s",
                            "requests_s",
                            "accept_length",
                            "ttft_p50_s",
                            "itl_p50_s",
                        )
                    }
                    for r in levels
                ],
                "sweep_peak": peak
                and {"concurrency": peak.get("concurrency"), "output_tok_s": peak.get("output_tok_s")},
                "server_view": self.server_view(v),
                "export_check": (s.get("export") or {}).get("check"),
                "gpu_used_mib_after_down": (s.get("down") or {}).get("gpu_used_mib_after"),
                "steps": {
                    k: {"rc": x.get("rc"), "wall_s": x.get("wall_s")}
                    for k, x in s.items()
                    if isinstance(x, dict) and "rc" in x
                },
            }
        if "spec" in rows and "nospec" in rows:
            on = {r["concurrency"]: r["output_tok_s"] for r in rows["spec"]["sweep"]}
            off = {r["concurrency"]: r["output_tok_s"] for r in rows["nospec"]["sweep"]}
            rows["spec_vs_nospec"] = {c: on[c] / off[c] for c in sorted(set(on) & set(off)) if off[c]}
        doc = {
            "engine": self.engine["kind"],
            "version": self.engine.get("version") or self.reported_version(),
            "gpu": self.state.get("gpu") or self.gpu_name(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started())),
            "fleet": self.fleet,
            "params": {
                k: getattr(self.a, k)
                for k in (
                    "prompts",
                    "concurrency",
                    "input_len",
                    "output_len",
                    "temperature",
                    "top_p",
                    "levels",
                    "rounds",
                )
            },
            "variants": rows,
        }
        name = f"gpu-{doc['engine']}-{doc['version']}-{doc['gpu']}"
        path = self.out / f"{name}.json"
        path.write_text(json.dumps(doc, indent=1, default=str))
        (self.out / f"{name}.md").write_text(markdown(doc))
        self.log(f"wrote {path}")
        return path

    def server_view(self, v: str) -> dict[str, Any]:
        """The same pair seen from the engine: its own decode throughput while each client ran, fleetgen's
        refill delay (finish → next dispatch), and the longest stall in the engine's batch lines."""
        log = self.raw / f"{v}-engine-log-end.txt"
        store = self.out / f"run-{v}" / "results.sqlite"
        eb = self.state.get(v, {}).get("engine_bench") or {}
        if not log.exists() or not store.exists():
            return {}
        with sqlite3.connect(store) as db:
            rows = db.execute("SELECT started_at, finished_at FROM results ORDER BY started_at").fetchall()
        starts, ends = [r[0] for r in rows], sorted(r[1] for r in rows)
        c = self.a.concurrency
        refill = sorted(starts[k] - ends[k - c] for k in range(c, len(starts)))
        batches = engine_batches(log.read_text(errors="replace"))
        view: dict[str, Any] = {
            "fleetgen_refill_delay_s": {"p50": refill[len(refill) // 2], "max": refill[-1]}
            if refill
            else None,
            "fleetgen": window_view(batches, starts[0], ends[-1]),
        }
        if "t0" in eb:
            view["engine_bench"] = window_view(batches, eb["t0"], eb["t1"])
        return view

    def started(self) -> float:
        """When the scenario's first recorded command began (the result's date), else now."""
        t0s = [
            x["t0"]
            for v in self.state.values()
            if isinstance(v, dict)
            for x in v.values()
            if isinstance(x, dict) and "t0" in x
        ]
        return min(t0s, default=time.time())

    def reported_version(self) -> str | None:
        """The engine version `hosts check` read on the host (the fleet file may not pin one)."""
        for v in self.state.values():
            check = v.get("check") if isinstance(v, dict) else None
            for host in (check or {}).get("json") or []:
                found = re.search(r"\d+\.\d+\.\d+\S*", json.dumps(host.get("engine_version") or ""))
                if found:
                    return found.group(0).rstrip('"')
        return None

    def gpu_name(self) -> str:
        if shutil.which("nvidia-smi"):
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=False,
            )
            if q.returncode == 0 and q.stdout.strip():
                return re.sub(r"[^a-z0-9]+", "", q.stdout.splitlines()[0].lower().replace("nvidia", ""))
        return "cpu"


BATCH_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (Decode|Prefill) batch")
RUNNING = re.compile(r"#running-req: (\d+)")
GEN_TPS = re.compile(r"gen throughput \(token/s\): ([\d.]+)")
VLLM_LINE = re.compile(
    r"INFO (\d\d-\d\d \d\d:\d\d:\d\d).*Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs"
)


def engine_batches(text: str) -> list[tuple[float, str, int | None, float | None]]:
    """(epoch, kind, running, gen tok/s) per batch line of an SGLang log, or per vLLM stats line (UTC)."""
    out: list[tuple[float, str, int | None, float | None]] = []
    year = time.gmtime().tm_year
    for line in text.splitlines():
        m = BATCH_LINE.match(line)
        if m:
            t = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            run, gen = RUNNING.search(line), GEN_TPS.search(line)
            out.append(
                (t, m.group(2), int(run.group(1)) if run else None, float(gen.group(1)) if gen else None)
            )
            continue
        m = VLLM_LINE.search(line)
        if m:
            t = calendar.timegm(time.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S"))
            out.append((t, "Decode", int(m.group(3)), float(m.group(2))))
    return out


def window_view(
    batches: list[tuple[float, str, int | None, float | None]], t0: float, t1: float
) -> dict[str, Any]:
    """Inside [t0, t1]: the engine's mean decode tok/s (all lines, and at its fullest batch), the longest gap
    between two batch lines (a stall: e.g. first-use kernel compilation), the most requests running."""
    inside = [b for b in batches if t0 - 1 <= b[0] <= t1 + 1]
    decode = [b for b in inside if b[1] == "Decode" and b[3] is not None]
    if not decode:
        return {}
    top = max(b[2] or 0 for b in decode)
    full = [b[3] for b in decode if b[2] == top and b[3] is not None]
    times = [t0, *(b[0] for b in inside), t1]
    return {
        "seconds": round(t1 - t0, 2),
        "decode_tok_s_mean": round(sum(b[3] or 0 for b in decode) / len(decode), 1),
        "decode_tok_s_at_full_batch": round(sum(full) / len(full), 1),
        "max_running": top,
        "longest_stall_s": round(max(b - a for a, b in itertools.pairwise(times)), 1),
    }


def check_sharegpt(path: Path, expected: int) -> dict[str, Any]:
    """Every line a SpecForge ShareGPT record (user then non-empty assistant turn), one per prompt. With
    random weights the model never closes its thinking block, so the export inlines the reasoning."""
    if not path.exists():
        return {"ok": False, "why": "no file"}
    n = bad = 0
    with path.open() as f:
        for line in f:
            n += 1
            rec = json.loads(line)
            conv = rec.get("conversations") or []
            roles = [t.get("role") for t in conv]
            if len(conv) < 2 or roles[-2:] != ["user", "assistant"] or not conv[-1].get("content"):
                bad += 1
    return {"ok": n == expected and bad == 0, "records": n, "bad": bad, "expected": expected}


def fmt(x: Any, pat: str = "{:,.0f}") -> str:
    return "—" if x is None else pat.format(x)


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# {doc['engine']} {doc['version']} on {doc['gpu']} ({doc['date']})",
        "",
        f"prompts {doc['params']['prompts']}, concurrency {doc['params']['concurrency']}, in "
        f"{doc['params']['input_len']} / out {doc['params']['output_len']} tokens (ignore_eos), thinking on",
        "",
        "| variant | planned KV tokens | actual KV tokens | planned max running | actual max running | "
        "fleetgen run tok/s | engine bench tok/s | ratio | sweep peak (c) | GPU MiB after down |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, r in doc["variants"].items():
        if v == "spec_vs_nospec":
            continue
        act = r.get("actual") or {}
        kv = act.get("kv_tokens") or (act.get("kv_tokens_log") or [None])[-1]
        mr = act.get("max_running_requests") or (act.get("max_concurrency_x") or [None])[-1]
        peak = r.get("sweep_peak") or {}
        lines.append(
            f"| {v} | {fmt(r['planned'].get('kv_tokens'))} | {fmt(kv)}"
            f" | {fmt(r['planned'].get('max_running_requests'))}"
            f" | {fmt(mr, '{}')} | {fmt(r['fleetgen_run']['window'].get('output_tok_s'), '{:,.1f}')}"
            f" | {fmt(r['engine_bench'].get('output_throughput'), '{:,.1f}')}"
            f" | {fmt(r['fleetgen_over_engine_bench'], '{:.3f}')}"
            f" | {fmt(peak.get('output_tok_s'), '{:,.0f}')} ({peak.get('concurrency')})"
            f" | {r.get('gpu_used_mib_after_down')} |"
        )
    lines += [
        "",
        "The same pair seen from the engine (its own log): decode tok/s while each client ran, at its "
        "fullest batch; the longest gap between its batch lines (a stall); fleetgen's refill delay "
        "(finish → next dispatch).",
        "",
        "| variant | engine tok/s (fleetgen run) | engine tok/s (engine bench) "
        "| longest stall (fleetgen run) | longest stall (engine bench) | refill delay p50 / max |",
        "|---|---|---|---|---|---|",
    ]
    for v, r in doc["variants"].items():
        sv = r.get("server_view") if isinstance(r, dict) else None
        if not sv:
            continue
        fg, eb, rd = (
            sv.get("fleetgen") or {},
            sv.get("engine_bench") or {},
            sv.get("fleetgen_refill_delay_s") or {},
        )
        lines.append(
            f"| {v} | {fmt(fg.get('decode_tok_s_at_full_batch'), '{:,.1f}')}"
            f" | {fmt(eb.get('decode_tok_s_at_full_batch'), '{:,.1f}')}"
            f" | {fmt(fg.get('longest_stall_s'), '{} s')} | {fmt(eb.get('longest_stall_s'), '{} s')}"
            f" | {fmt(rd.get('p50'), '{:.5f}')} / {fmt(rd.get('max'), '{:.4f}')} s |"
        )
    if "spec_vs_nospec" in doc["variants"]:
        pairs = ", ".join(f"c={c}: {x:.2f}x" for c, x in doc["variants"]["spec_vs_nospec"].items())
        lines += [
            "",
            f"spec on / off output tok/s per sweep level: {pairs} (dummy weights: MTP accepts nothing,"
            " so this is its cost)",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-f", "--fleet", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--levels", default="8,16,32,64,128", help="bench sweep levels (capped by the server)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--up-timeout", type=float, default=1500)
    ap.add_argument("--variants", default="spec,nospec")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"any of {','.join(STEPS)}")
    a = ap.parse_args()
    sc = Scenario(a)
    steps = a.steps.split(",")
    variants = sc.variants()
    chosen = [v for v in a.variants.split(",") if v in variants]
    for i, v in enumerate(chosen):
        sc.state.setdefault(v, {})
        if i and "up" in steps:
            sc.switch(chosen[i - 1], variants[chosen[i - 1]])
        for step in steps:
            if step in ("report",) or (step == "down" and i < len(chosen) - 1):
                continue  # the next variant's `up` replaces this one's server; `down` once at the end
            if step == "check" and v != chosen[0]:
                continue
            getattr(sc, f"step_{step}")(v, variants[v])
            sc.save()
    if "report" in steps:
        sc.report()


if __name__ == "__main__":
    main()
