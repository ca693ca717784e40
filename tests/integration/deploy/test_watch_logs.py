"""`fleetgen status --watch` and `fleetgen logs` (tail, follow) as a user runs them, over REAL sshd hosts.

SGLang cannot start without a GPU, so the engine is `fleetgen.sim` (same launch script, /proc checks, log
files and tunnels as SGLang). The commands run as subprocesses with a bounded life: stopped with SIGINT
(Ctrl-C) once they showed what is tested. Deadlines below only guard against hangs; nothing asserts speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleetgen.config import load_fleet
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.support import write_fleet

FLEETGEN = str(Path(sys.executable).with_name("fleetgen"))
HANG_GUARD_S = 120.0  # only so a broken command fails the test instead of hanging it
SIM_ARGS = {
    "max-running-requests": 8,
    # 50 tokens/s and 100 tokens: a request decodes for ~2 s, so the sim logs "Decode batch" lines.
    "sim-decode-tps": 50.0,
    "sim-output-tokens": 100,
}


@pytest.fixture
async def fleet(ssh_hosts: list[SshdHost], tmp_path: Path) -> AsyncIterator[Path]:
    """One host, two instances of fleetgen.sim, up and verified; down afterwards."""
    model = tmp_path / "model"
    model.mkdir()
    path = write_fleet(
        tmp_path / "fleet.toml",
        ssh_hosts[:1],
        kind="sglang",
        python=sys.executable,
        model=str(model),
        workdir_tag=tmp_path.name,
        gpus=(0, 1),
        launcher=["-m", "fleetgen.sim"],
        ready_timeout_s=300.0,
        args=SIM_ARGS,
    )
    try:
        outs = await up(Fleet.load(path))
        assert [(o.instance, o.error) for o in outs] == [("h0-0", None), ("h0-1", None)]
        yield path
    finally:
        await down(Fleet.load(path))


class Command:
    """A fleetgen subprocess whose stdout is read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    async def next_line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), HANG_GUARD_S)
        assert raw, f"the command ended early: {await self.stderr()}"
        self.lines.append(raw.decode().rstrip("\n"))
        return self.lines[-1]

    async def line_where(self, wanted: Callable[[str], bool]) -> str:
        while not wanted(line := await self.next_line()):
            pass
        return line

    async def interrupt(self) -> int:
        """Ctrl-C, as a user ends a watch or a follow; returns the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return await asyncio.wait_for(self.proc.wait(), HANG_GUARD_S)

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()


@contextlib.asynccontextmanager
async def command(*args: str) -> AsyncIterator[Command]:
    proc = await asyncio.create_subprocess_exec(
        FLEETGEN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        yield Command(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def ready_by_instance(line: str) -> dict[str, tuple[bool, int | None, str]]:
    rows: list[dict[str, Any]] = json.loads(line)
    return {r["instance"]: (r["ready"], r["pid"], r["problem"]) for r in rows}


async def until(what: str, check: Callable[[], bool]) -> None:
    """Poll a (quick, local) check until it holds; fail after the hang guard."""
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            while True:
                if check():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"gave up waiting for {what}")


def is_dead(pid: int) -> bool:
    """Gone or a zombie (the test host is this machine: read /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in "ZX"


async def test_status_watch_shows_the_truth_at_every_refresh(fleet: Path) -> None:
    async with command("status", "-f", str(fleet), "--watch", "--json", "--interval", "0.5") as watch:
        first = ready_by_instance(await watch.next_line())
        assert {name: ready for name, (ready, _, _) in first.items()} == {"h0-0": True, "h0-1": True}
        victim = first["h0-1"][1]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)  # the server dies between refreshes (the host is this machine)
        await until("the killed server to die", lambda: is_dead(victim))
        # The refresh under way at the kill may have read the process alive; the one after cannot.
        await watch.next_line()
        after = ready_by_instance(await watch.next_line())
        assert after["h0-1"] == (False, None, "not running")
        assert after["h0-0"][:2] == first["h0-0"][:2]  # the other instance is untouched

        # Brought back by `up`: the same watch (same tunnels) sees the new process ready.
        [healed] = await up(Fleet.load(fleet), only=["h0-1"])
        assert healed.error is None and healed.pid not in (None, victim)
        # The lines the watch printed while `up` ran are still queued (not running, then the new process
        # loading): read on until it shows the new process ready, and never the killed one again.
        for _line in range(100):  # a bound only so a broken watch fails the test instead of hanging it
            again = ready_by_instance(await watch.next_line())
            assert again["h0-1"][1] in (None, healed.pid), again
            if again["h0-1"][:2] == (True, healed.pid):
                break
        else:
            pytest.fail(f"the watch never showed the new process ready: {again}")
        code = await watch.interrupt()
    assert code == 0, await watch.stderr()  # Ctrl-C is how a watch ends: not an error
    assert len(watch.lines) >= 5


def current_log(fleet: Path, name: str) -> Path:
    [inst] = [i for i in load_fleet(fleet).instances() if i.name == name]
    host = load_fleet(fleet).host(inst.host)
    return Path(host.workdir) / name / "logs" / "current.log"


async def test_logs_tail_prints_exactly_the_last_lines(fleet: Path) -> None:
    log = current_log(fleet, "h0-0")
    # The verification request of `up` still gets a "Decode batch" line logged a moment later: compare
    # against a log that did not move while the command ran (else read again).
    for _attempt in range(10):
        before = log.read_text().splitlines()
        async with command("logs", "h0-0", "-n", "5", "--fleet", str(fleet)) as logs:
            out, err = await asyncio.wait_for(logs.proc.communicate(), HANG_GUARD_S)
        assert logs.proc.returncode == 0, err.decode()
        if log.read_text().splitlines() == before:
            break
    else:
        pytest.fail("the log never stopped moving")
    assert len(before) > 5 and out.decode().splitlines() == before[-5:]


def tail_processes(path: Path) -> list[int]:
    """PIDs of `tail -F … <path>` processes (the follower's remote side; the host is this machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"tail") and b"-F" in argv and str(path).encode() in argv:
                found.append(int(entry.name))
    return found


def is_same_file(a: Path, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


async def chat(fleet: Path, name: str) -> None:
    """One chat request straight to the instance's port (the host is this machine)."""
    [inst] = [i for i in load_fleet(fleet).instances() if i.name == name]
    body = {"model": "default", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100}
    url = f"http://127.0.0.1:{inst.port}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()


async def test_logs_follow_prints_new_lines_then_the_next_launch(fleet: Path) -> None:
    log = current_log(fleet, "h0-0")
    async with command("logs", "h0-0", "-f", "-n", "3", "--fleet", str(fleet)) as follow:
        for _ in range(3):
            await follow.next_line()
        # The follower's `tail -F` runs: lines written from now on must be seen.
        await until("the remote tail -F", lambda: bool(tail_processes(log)))
        await chat(fleet, "h0-0")  # the sim logs "Decode batch" lines while it decodes
        await follow.line_where(lambda line: "Decode batch, #running-req: 1" in line)
        # Nothing lost, nothing twice: the tail and the new lines are one run of the log's lines (the log may
        # grow as the follower starts: `up`'s verification request gets its decode line a moment late).
        assert is_run_of(follow.lines, log.read_text().splitlines())

        # A restart re-points current.log at a new file: the follower moves to it (tail -F semantics).
        [restarted] = await up(Fleet.load(fleet), only=["h0-0"], force=True)
        assert restarted.error is None
        await follow.line_where(lambda line: "The server is fired up and ready to roll!" in line)
        assert is_same_file(log, restarted.log_path)  # current.log now names the new launch's log
        code = await follow.interrupt()
    assert code == 0, await follow.stderr()
    # The remote side ends with the follower: nothing is left running on the host.
    await until("the remote tail -F to end", lambda: not tail_processes(log))


def is_run_of(printed: list[str], lines: list[str]) -> bool:
    """`printed` equals lines[k : k + len(printed)] for some k."""
    n = len(printed)
    return any(lines[k : k + n] == printed for k in range(len(lines) - n + 1))
