"""`fleetgen tune` end to end against `fleetgen.sim` (real processes on this machine, launched by `up` on a
`local` host; the sim's decode step takes a roofline's time over the bytes it reads, so its rate depends on
the batch as a GPU's does, and its admission is capped by SGLang's own Mamba arithmetic).

What must hold: for a hybrid model (Qwen3.6-27B's shape) on a job of distinct prompts with long outputs, the
radix cache off and a large max running requests beat the engine's defaults; the budget stops rounds; the
tuned file is new, `plan` reads it back with the winner's flags, the user's file is untouched; no tune
server is left running; what tune must refuse is refused before anything starts.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import fleetgen
from tests.fixtures.ports import free_port
from tests.integration.deploy.test_sglang import QWEN36

SRC = str(Path(fleetgen.__file__).resolve().parents[1])  # the sims run this checkout's fleetgen


def fleetgen_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def sim_fleet(tmp_path: Path, base_port: int) -> Path:
    """Two simulated H200s on this machine running the engine's defaults (the fleet file as a user
    writes it), metrics on, with a roofline's pace."""
    text = f"""
[engine]
kind = "sglang"
python = "{sys.executable}"
model = "{QWEN36}"
model_config = "{QWEN36}"
launcher = ["-m", "fleetgen.sim"]
ready_timeout_s = 120.0
base_port = {base_port}

[engine.args]
sim-bandwidth-gbs = 4800
sim-gpu-memory-gib = 140.4
mem-fraction-static = 0.85

[engine.env]
PYTHONPATH = "{SRC}"

[[hosts]]
name = "h"
ssh = "local"
workdir = "{tmp_path / "work"}"
gpus = [0, 1]
gpu_memory_gib = 140.4
"""
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def job_input(tmp_path: Path) -> tuple[Path, Path]:
    """20,000 distinct prompts of some 80 tokens (they share little prefix: the radix cache buys nothing)
    and a job file."""
    rng = random.Random(7)
    words = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "sierra", "tango", "zulu"]
    lines = (
        json.dumps({"id": f"q{i}", "prompt": f"{i}: " + " ".join(rng.choices(words, k=60))}) + "\n"
        for i in range(20000)
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(lines))
    job = tmp_path / "job.toml"
    job.write_text("max_tokens = 1000\ntemperature = 0.6\n")
    return prompts, job


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_tune_finds_radix_off_with_a_large_batch_writes_a_fleet_plan_reads_and_stops_its_servers(
    tmp_path: Path,
) -> None:
    port = free_port(span=102)  # the fleet's two instances, tune's at + 100
    fleet = sim_fleet(tmp_path, port)
    before = fleet.read_bytes()
    prompts, job = job_input(tmp_path)
    lengths = "mean=300,min=50,max=1000"
    knobs = ["--window", "8", "--warmup", "30", "--budget", "100s", "--output-lengths", lengths, "--json"]
    done = fleetgen_cli("tune", "-f", str(fleet), "--job", str(job), str(prompts), *knobs)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {r["candidate"]: r for r in result["candidates"]}
    base = rows["as-written"]
    [chosen] = [r for r in result["candidates"] if r["chosen"]]
    # the engine's defaults: the Mamba pool's slots ÷ ρ 5 admit a few dozen; radix off: one slot each
    assert chosen["args"]["disable-radix-cache"] is True
    assert chosen["engine_admitted"] >= 4 * base["engine_admitted"]
    assert chosen["planned_running"] == chosen["engine_admitted"]  # planned as the engine admits
    assert chosen["decode_tps_per_gpu"] > base["decode_tps_per_gpu"] and chosen["ratio_to_as_written"] > 1
    # the budget: a round takes about a third of it, so later rounds were not started
    assert result["unmeasured"] and result["rounds"] < 4
    assert len(result["candidates"]) == 2 * result["rounds"]
    # the tuned file: new, beside the user's, untouched; plan reads it back with the winner's flags
    tuned = Path(result["out"])
    assert tuned == tmp_path / "fleet.tuned.toml" and fleet.read_bytes() == before
    assert "# tune " in tuned.read_text() and (tmp_path / "fleet.tuned.svg").is_file()
    planned = fleetgen_cli("plan", "--json", "--offline", "-f", str(tuned))
    assert planned.returncode == 0, planned.stderr
    for inst in json.loads(planned.stdout)["instances"]:
        argv = inst["argv"]
        assert "--disable-radix-cache" in argv
        assert argv[argv.index("--max-running-requests") + 1] == str(chosen["args"]["max-running-requests"])
    # the steady start: a batch's worth of each candidate's first requests carried what they had written
    # (filler after the prompt: the sim counts it in prompt_tokens), the rest the prompt alone (~80 tokens)
    tune_dir = tmp_path / ".fleetgen" / "tune"
    for row in result["candidates"]:
        if row["error"]:
            continue  # a candidate that did not start has no store (the sim on a busy machine, rarely)
        [store] = tune_dir.glob(f"*/round*/*-{row['candidate']}/store/results.sqlite")
        with sqlite3.connect(store) as db:
            long = db.execute("SELECT count(*) FROM results WHERE prompt_tokens > 200").fetchone()[0]
            short = db.execute("SELECT count(*) FROM results WHERE prompt_tokens <= 200").fetchone()[0]
        assert long >= 5 and short >= 1, store
    # nothing left running: every tune server on its own port, stopped
    assert not any(is_listening(p) for p in (port + 100, port + 101))
    states = list((tmp_path / ".fleetgen" / "tune").glob("*/round*/*/.fleetgen/state.json"))
    assert states and all(json.loads(s.read_text()).get("instances", {}) == {} for s in states)


def test_tune_refuses_keeping_a_forced_acceptance_and_dummy_weights_without_lengths(tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, free_port(span=102))
    prompts, job = job_input(tmp_path)
    kept = fleetgen_cli(
        "tune", "-f", str(fleet), str(prompts), "--keep", "chosen", "--simulate-accept-length", "3"
    )
    assert kept.returncode == 2 and "never leaves one running" in kept.stderr
    fleet.write_text(fleet.read_text().replace("[engine.args]\n", '[engine.args]\nload-format = "dummy"\n'))
    dummy = fleetgen_cli("tune", "-f", str(fleet), "--job", str(job), str(prompts))
    assert dummy.returncode == 2 and "--output-lengths" in dummy.stderr
    assert not (tmp_path / ".fleetgen").exists() and not (tmp_path / "fleet.tuned.toml").exists()


def test_only_a_pattern_naming_no_candidate_is_refused_before_anything_starts(tmp_path: Path) -> None:
    port = free_port(span=102)
    fleet = sim_fleet(tmp_path, port)
    prompts, job = job_input(tmp_path)
    lengths = ["--output-lengths", "mean=300,min=50,max=1000"]
    done = fleetgen_cli(
        "tune", "-f", str(fleet), "--job", str(job), str(prompts), *lengths, "--only", "*-mtp,nope-*"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "nope-*" in done.stderr and "offered: " in done.stderr and "no-radix-" in done.stderr
    said = " ".join(done.stderr.split())
    assert "--only nope-*: no candidate" in said  # the pattern that names candidates (MTP's) is not blamed
    assert not list((tmp_path / ".fleetgen").glob("tune/*/round*"))  # no server was started
    assert not any(is_listening(p) for p in (port + 100, port + 101))


def test_a_batch_not_settled_by_the_warmup_is_never_ranked(tmp_path: Path) -> None:
    """`--warmup 0`: no candidate's batch is ready at its first look, so each is an error naming the fix,
    none is chosen, no tuned file is written, and tune exits non-zero."""
    fleet = sim_fleet(tmp_path, free_port(span=102))
    prompts, job = job_input(tmp_path)
    knobs = [
        "--window",
        "5",
        "--warmup",
        "0",
        "--budget",
        "1s",
        "--output-lengths",
        "mean=300,min=50,max=1000",
    ]
    done = fleetgen_cli("tune", "-f", str(fleet), "--job", str(job), str(prompts), *knobs, "--json")
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["candidates"] and not result["chosen"] and result["out"] is None
    assert all("--warmup" in r["error"] and not r["chosen"] for r in result["candidates"])
    assert not (tmp_path / "fleet.tuned.toml").exists()


def test_a_candidate_whose_every_request_is_refused_says_so_in_the_servers_words(tmp_path: Path) -> None:
    """The user's context-length (100) is below every request of the job: the sim refuses each as SGLang
    does, the load stops (every request refused), and that candidate's error quotes the server: never a
    rate of 0 read over nothing (seen on the H200: vLLM refused a candidate's requests and tune said only
    that the input ran out)."""
    fleet = sim_fleet(tmp_path, free_port(span=102))
    fleet.write_text(fleet.read_text().replace("[engine.args]\n", "[engine.args]\ncontext-length = 100\n"))
    prompts, job = job_input(tmp_path)
    knobs = ["--window", "5", "--budget", "1s", "--output-lengths", "mean=300,min=50,max=1000"]
    done = fleetgen_cli("tune", "-f", str(fleet), "--job", str(job), str(prompts), *knobs, "--json")
    result = json.loads(done.stdout)
    rows = {r["candidate"]: r for r in result["candidates"]}
    written = rows["as-written"]
    assert "every request is refused by the servers with HTTP 400" in written["error"], done.stderr[-3000:]
    assert "context length" in written["error"] and "100 tokens" in written["error"]  # SGLang's words
    assert not written["chosen"] and written["decode_tps_per_gpu"] is None
    assert result["job"]["steady_start_filler"]["unit"] == " the"


def test_an_input_smaller_than_a_batch_is_no_rate(tmp_path: Path) -> None:
    """Three records for engines that run dozens: each candidate's load ends before its batch fills; that
    is an error naming the fix, never a rate read over what was left, and tune exits non-zero."""
    fleet = sim_fleet(tmp_path, free_port(span=102))
    prompts, job = job_input(tmp_path)
    prompts.write_text("".join(prompts.read_text().splitlines(keepends=True)[:3]))
    knobs = ["--window", "5", "--budget", "1s", "--output-lengths", "mean=300,min=50,max=1000"]
    done = fleetgen_cli("tune", "-f", str(fleet), "--job", str(job), str(prompts), *knobs, "--json")
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["candidates"] and not result["chosen"]
    assert all("give a larger input" in r["error"] for r in result["candidates"])


OOM_LOG = Path(__file__).parents[2] / "data" / "real-engines" / "sglang-0.5.15-h100-tune" / "engine-oom.log"


def die_of_oom_under_load(work: Path, stop: threading.Event, prefix: str = "*-tune0-") -> list[int]:
    """Watch the servers' folders under `work` (`prefix`: tune's slot 0); the first whose log shows a decode
    batch of two requests or more (under load, not `up`'s one verify request) gets the H100's real
    OOM traceback appended to its log (its last words, as SGLang's scheduler wrote them) and is killed
    (SIGKILL: the sim has no way to die of memory). The pids it killed."""
    oom = OOM_LOG.read_text().splitlines(keepends=True)
    words = oom[next(i for i, x in enumerate(oom) if "Scheduler hit an exception" in x) :]
    killed: list[int] = []
    while not stop.is_set() and not killed:
        for folder in work.glob(f"{prefix}*"):
            log, pidfile = folder / "logs" / "current.log", folder / "pid"
            if not (pidfile.is_file() and log.is_file()):
                continue
            running = re.findall(r"Decode batch, #running-req: (\d+)", log.read_text(errors="replace"))
            if any(int(n) >= 2 for n in running):
                with log.open("a") as f:
                    f.writelines(words)
                pid = int(pidfile.read_text().strip())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        stop.wait(0.5)
    return killed


def test_a_candidate_whose_engine_dies_under_load_is_an_error_in_its_words_and_the_search_goes_on(
    tmp_path: Path,
) -> None:
    """One candidate's engine dies under the load (the H100's CUDA OOM in the GDN chunked prefill, its log's
    last words): its row is an error quoting the engine (the exception, where it was raised, the fix), never
    the transport error its metrics left ("GET …/metrics failed: ClientConnectorError"); the candidate beside
    it is measured and chosen."""
    fleet = sim_fleet(tmp_path, free_port(span=102))
    prompts, job = job_input(tmp_path)
    knobs = [
        "--window",
        "8",
        "--warmup",
        "30",
        "--budget",
        "1s",
        "--output-lengths",
        "mean=300,min=50,max=1000",
    ]
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        killer = pool.submit(die_of_oom_under_load, tmp_path / "work", stop)
        done = fleetgen_cli("tune", "-f", str(fleet), "--job", str(job), str(prompts), *knobs, "--json")
        stop.set()
        assert killer.result(), done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {r["candidate"]: r for r in result["candidates"]}
    dead = rows["as-written"]
    assert dead["error"].startswith(
        "the engine died: GPU out of memory: torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 202.00 MiB."
    ), done.stderr[-3000:]
    assert "(at chunk_delta_h.py:324 in chunk_gated_delta_rule_fwd_h)" in dead["error"]
    assert "fix: lower mem-fraction-static" in dead["error"]
    assert "ClientConnector" not in dead["error"] and "/metrics" not in dead["error"]
    assert dead["decode_tps_per_gpu"] is None and not dead["chosen"]
    [alive] = [r for r in result["candidates"] if r["candidate"] != "as-written"]
    assert not alive["error"] and alive["chosen"] and alive["decode_tps_per_gpu"] > 0
