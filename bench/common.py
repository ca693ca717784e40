"""Shared machinery of the bench suite: measured child processes, servers, inputs, result rows.

Every driver (fleetgen, the peers) runs as its own child process and is measured with `os.wait4`: the kernel's
own user+sys CPU and peak RSS of that process (and the children it reaped), nothing sampled. Servers run in
their own processes too, so their CPU is never counted against a driver.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLEETGEN_PY = Path(os.environ.get("FLEETGEN_PYTHON", REPO / ".venv" / "bin" / "python"))
BENCH_VENV = Path(os.environ.get("BENCH_VENV", Path.home() / ".cache" / "fleetgen" / "bench-venv"))
BENCH_PY = BENCH_VENV / "bin" / "python"
VLLM_VENV = Path(os.environ.get("FLEETGEN_VLLM_VENV", Path.home() / ".cache" / "fleetgen" / "vllm-venv"))
TINY_MODEL = Path(os.environ.get("FLEETGEN_TINY_MODEL", Path.home() / ".cache" / "fleetgen" / "tiny-model"))
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Skip(Exception):
    """A section cannot run here (a piece is missing); the message says what and how to get it."""


@dataclass
class Row:
    """One line of the result table: a metric for fleetgen and its peers, and the target it must meet."""

    section: str
    metric: str
    unit: str
    values: Mapping[str, float | None]  # driver name → value
    ratio: float | None = None  # the comparison the target is about (see `ratio_text`)
    ratio_text: str = ""
    target: str = ""
    is_met: bool | None = None
    note: str = ""


@dataclass
class Measured:
    """What one child process cost."""

    argv: list[str]
    returncode: int
    wall_s: float
    cpu_user_s: float
    cpu_sys_s: float
    max_rss_mb: float
    log_path: Path
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s

    def log_tail(self, num_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.Popen[bytes], float]:
    """Start a child in its own process group, stdout+stderr to `log_path`; return it and its start time."""
    log = log_path.open("wb")
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    log.close()
    return proc, start


def reap(proc: subprocess.Popen[bytes], start: float, argv: Sequence[str], log_path: Path) -> Measured:
    """Wait for a child with wait4: its own rusage (user, sys, peak RSS), exact."""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(
        list(argv), proc.returncode, wall, usage.ru_utime, usage.ru_stime, usage.ru_maxrss / 1024, log_path
    )


def measure(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None, timeout_s: float = 3600.0
) -> Measured:
    """Run a child to the end and measure it; kill its group if it outlives `timeout_s`.

    Peak RSS is the child's own VmHWM, polled while it runs: wait4's ru_maxrss is useless here, because Linux
    carries the pre-exec image's high-water mark (this bench process, vfork'ed) across exec.
    """
    proc, start = spawn(argv, log_path, env)
    deadline = start + timeout_s
    peak_kb = 0
    while _alive(proc.pid):
        peak_kb = max(peak_kb, vm_hwm_kb(proc.pid))
        if time.perf_counter() > deadline:
            kill_group(proc)
            break
        time.sleep(0.05)
    measured = reap(proc, start, argv, log_path)
    measured.max_rss_mb = peak_kb / 1024
    return measured


def vm_hwm_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM, kB) so far; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


def _alive(pid: int) -> bool:
    """True while the child has not exited (a zombie counts as exited; we do not reap it here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def proc_cpu_s(pid: int) -> float:
    """User+sys CPU seconds a live process has used so far (/proc/PID/stat fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the child's process group, SIGKILL after `grace`; never touches anything else."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def wait_http(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> float:
    """Poll `url` until it answers 200; return the time it took. Raises with the log tail if it never does."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if not _alive(proc.pid):
            raise RuntimeError(f"server exited before {url} answered:\n{log_path.read_text()[-3000:]}")
        if http_get(url, 1.0)[0] == 200:
            return time.perf_counter() - start
        time.sleep(0.02)
    raise RuntimeError(f"{url} not ready after {timeout_s} s:\n{log_path.read_text()[-3000:]}")


def start_together(
    servers: Sequence[tuple[Sequence[str], int, Path]], timeout_s: float, env: dict[str, str] | None = None
) -> float:
    """Spawn every server (its argv, the port it serves, its log) at once; the seconds until each answers
    /health. They are stopped before it returns, answered or not."""
    procs, start = [], time.perf_counter()
    try:
        for argv, port, log in servers:
            procs.append((spawn(argv, log, env)[0], port, log))
        for proc, port, log in procs:
            wait_http(f"http://127.0.0.1:{port}/health", proc, log, timeout_s)
        return time.perf_counter() - start
    finally:
        for proc, _, _ in procs:
            kill_group(proc)


@dataclass
class Server:
    """A server child: base URL, process, log."""

    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_s: float

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)


def sim_argv(port: int, *, output_tokens: int, reasoning: bool = True, model: str = "sim-model") -> list[str]:
    """`python -m fleetgen.sim` at zero latency (the brief's "instant server")."""
    argv = [
        str(FLEETGEN_PY),
        "-m",
        "fleetgen.sim",
        "--model-path",
        f"/models/{model}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--sim-decode-tps",
        "0",
        "--sim-output-tokens",
        str(output_tokens),
    ]
    if reasoning:
        argv += ["--reasoning-parser", "qwen3"]
    return argv


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    health_url: str,
    base_url: str,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> Iterator[Server]:
    """Start a server child, wait for its health URL, yield it, stop its whole process group."""
    proc, _ = spawn(argv, log_path, env)
    try:
        ready = wait_http(health_url, proc, log_path, timeout_s)
        yield Server(base_url, proc, log_path, ready)
    finally:
        kill_group(proc)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, 0)


@contextlib.contextmanager
def sim_server(workdir: Path, *, output_tokens: int, reasoning: bool = True) -> Iterator[Server]:
    """The simulated SGLang server at zero latency, in its own process."""
    if not (REPO / "src" / "fleetgen" / "sim" / "__main__.py").exists():
        raise Skip("fleetgen.sim has no __main__ yet (python -m fleetgen.sim): the sim engineer's piece")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running(
        sim_argv(port, output_tokens=output_tokens, reasoning=reasoning),
        url + "/health",
        url,
        workdir / f"sim-{port}.log",
        timeout_s=60,
    ) as server:
        yield server


def write_records(path: Path, num: int, *, prompt_words: int = 12, start: int = 0) -> Path:
    """`num` JSONL records {"id", "prompt"}; short distinct prompts (ids r<start..start+num-1>)."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    words += ["iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi"]
    with path.open("w", encoding="utf-8") as f:
        for i in range(start, start + num):
            body = " ".join(words[(i + k) % len(words)] for k in range(prompt_words))
            f.write(json.dumps({"id": f"r{i}", "prompt": f"Task {i}: {body}"}) + "\n")
    return path


def need_file(path: Path, why: str) -> None:
    if not path.exists():
        raise Skip(f"{path} is missing: {why}")


def python_for_bench() -> str:
    need_file(BENCH_PY, "run bench/setup.sh (creates the peers' venv)")
    return str(BENCH_PY)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Context:
    """What every section gets: a scratch folder, quick mode, and a place for details that go in the JSON."""

    workdir: Path
    quick: bool
    details: dict[str, object] = field(default_factory=dict)


FLEETGEN_BIN = FLEETGEN_PY.parent / "fleetgen"


def fleetgen_run_argv(
    input_path: Path,
    out_dir: Path,
    urls: Sequence[str],
    *,
    concurrency: int,
    max_tokens: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """`fleetgen run INPUT -o OUT --endpoint URL …` with the bench's settings (one place to adapt)."""
    argv = [str(FLEETGEN_BIN), "run", str(input_path), "-o", str(out_dir), "--no-live"]
    for url in urls:
        argv += ["--endpoint", url]
    argv += ["--concurrency", str(concurrency), "--max-tokens", str(max_tokens)]
    return argv + list(extra)


def need_fleetgen_command(name: str) -> None:
    """Skip unless `fleetgen NAME` is registered (the CLI topic has landed)."""
    out = subprocess.run([str(FLEETGEN_BIN), name, "--help"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise Skip(f"`fleetgen {name}` is not available yet: {(out.stderr or out.stdout).strip()[-200:]}")
