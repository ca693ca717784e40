"""Host operations against a real OpenSSH server on 127.0.0.1 (and the same checks on LocalHost).

Run, verified put, detached spawn, /proc inspection, group stop, tail/follow, and the clear errors for a
missing program, a missing folder or an existing log. No mocks: real sshd, real processes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleetgen.config import HostEntry
from fleetgen.errors import CommandError, RemoteError
from fleetgen.remote import Host, HostState, LocalHost, ProcState, SshHost, open_host
from fleetgen.remote.base import ProcInfo
from tests.fixtures.sshd import SshdHost

SLEEPER = "#!/bin/sh\necho started\nexec sleep 300\n"


@pytest.fixture(params=["ssh", "local"])
async def host(request: pytest.FixtureRequest, ssh_hosts: list[SshdHost]) -> AsyncIterator[Host]:
    entry = ssh_hosts[0].entry() if request.param == "ssh" else HostEntry(name="here", ssh="local")
    async with open_host(entry) as opened:
        yield opened


async def test_open_host_picks_the_transport(ssh_hosts: list[SshdHost]) -> None:
    assert isinstance(open_host(ssh_hosts[0].entry()), SshHost)
    assert isinstance(open_host(HostEntry(name="here", ssh="local")), LocalHost)


async def test_run_returns_output_and_raises_with_context(host: Host) -> None:
    result = await host.run(["sh", "-c", 'printf "%s|" "$@"; echo err >&2', "x", "a b", "$HOME"])
    assert result.stdout == "a b|$HOME|"
    assert result.stderr == "err\n"
    with pytest.raises(CommandError) as caught:
        await host.run(["sh", "-c", "echo boom >&2; exit 3"])
    assert caught.value.context["exit code"] == 3
    assert "boom" in str(caught.value.context["stderr"])
    assert caught.value.context["host"] == host.name
    assert (await host.run(["false"], check=False)).exit_status == 1


async def test_missing_program_says_not_found_and_how_to_fix(host: Host) -> None:
    with pytest.raises(CommandError) as caught:
        await host.run(["python-that-does-not-exist", "-V"])
    assert "was not found" in caught.value.message
    assert "install" in caught.value.fix and "full path" in caught.value.fix


async def test_a_command_killed_by_a_signal_exits_as_a_shell_reports_it(host: Host) -> None:
    """128 + the signal's number on every kind of host (asyncio says -9 here; SSH sends the signal's name)."""
    assert (await host.run(["sh", "-c", "kill -KILL $$"], check=False)).exit_status == 128 + 9
    assert (await host.run(["sh", "-c", "kill -TERM $$"], check=False)).exit_status == 128 + 15


async def test_run_timeout_is_an_error_not_a_hang(host: Host) -> None:
    with pytest.raises(CommandError, match="did not finish within"):
        await host.run(["sleep", "30"], timeout=0.5)
    assert (await host.run(["echo", "still usable"])).stdout == "still usable\n"


async def test_a_cancel_that_lands_as_a_local_command_ends_is_never_lost(tmp_path: Path) -> None:
    """A task cancelled (a job's end cancels its probes and restarts) just as its command has finished
    must still end: a lost cancel (Python 3.11's asyncio.wait_for returns the result instead) leaves a
    probe looping and `fleetgen run` never exits."""
    async with LocalHost("here") as host:
        for k in range(20):
            ended = tmp_path / f"ended-{k}"  # the command's last act: it has run once this exists
            before = asyncio.all_tasks()
            run = asyncio.create_task(host.run(["sh", "-c", f"exec touch '{ended}'"]))
            seen: set[asyncio.Task[object]] = set()
            async with asyncio.timeout(30):  # a guard against a hang, not a measure of speed
                # Until the command ran and every task the run started (asyncio's readers of the child's
                # output, which end at its exit) has ended: the run is about to return.
                while not (ended.exists() and seen and all(t.done() for t in seen)):
                    await asyncio.sleep(0)
                    seen |= asyncio.all_tasks() - before - {run}
            assert not run.done()
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run


async def test_put_is_verified_atomic_and_creates_folders(host: Host, tmp_path: Path) -> None:
    target = tmp_path / host.name / "deep" / "er" / "file.bin"
    data = bytes(range(256)) * 40
    digest = await host.put(str(target), data, 0o750)
    assert digest == hashlib.sha256(data).hexdigest()
    assert target.read_bytes() == data
    assert target.stat().st_mode & 0o777 == 0o750
    assert await host.read(str(target)) == data
    await host.put(str(target), b"second", 0o644)  # overwrite in place
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.bin"]  # no temp file left


async def test_put_into_an_impossible_folder_names_the_cause(host: Host, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RemoteError) as caught:
        await host.put(str(blocker / "sub" / "f.txt"), b"data")
    assert f"cannot create folder {blocker / 'sub'}" in caught.value.message
    assert "may write there" in caught.value.fix


async def test_tilde_paths_expand_to_the_remote_home(host: Host) -> None:
    home = await host.home()
    assert home.startswith("/")
    assert await host.expand("~/x/y") == f"{home.rstrip('/')}/x/y"
    assert await host.exists("~")


async def test_spawn_inspect_stop(host: Host, tmp_path: Path) -> None:
    script = tmp_path / f"{host.name}-run.sh"
    await host.put(str(script), SLEEPER.encode(), 0o755)
    log, pidfile = tmp_path / "logs" / "1.log", tmp_path / "run" / "x.pid"
    spawned = await host.spawn(str(script), str(log), str(pidfile), cwd=str(tmp_path))
    assert pidfile.read_text().strip() == str(spawned.pid)
    info = await _wait_for_argv(host, spawned.pid, spawned.start_time, ("sleep", "300"))
    assert info.state is ProcState.RUNNING and info.argv == ("sleep", "300")
    assert info.start_time == spawned.start_time
    assert (
        await host.inspect(spawned.pid, spawned.start_time + 1)
    ).state is ProcState.GONE  # PID reuse guard
    await _wait_for_line(host, str(log), "started")
    await host.stop(spawned.pid, start_time=spawned.start_time, timeout=10)
    assert (await host.inspect(spawned.pid, spawned.start_time)).state is not ProcState.RUNNING


async def test_spawn_refuses_to_reuse_a_log(host: Host, tmp_path: Path) -> None:
    script = tmp_path / "s.sh"
    await host.put(str(script), b"#!/bin/sh\nexit 0\n", 0o755)
    log = tmp_path / "held.log"
    log.write_text("another process's log\n")
    with pytest.raises(CommandError) as caught:
        await host.spawn(str(script), str(log), str(tmp_path / "p.pid"), cwd=str(tmp_path))
    assert "exists already" in caught.value.message and "new log file" in caught.value.fix
    assert log.read_text() == "another process's log\n"  # not truncated


async def test_spawn_in_a_missing_folder_says_so(host: Host, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(CommandError) as caught:
        await host.spawn("run.sh", str(tmp_path / "l.log"), str(tmp_path / "p.pid"), cwd=str(missing))
    assert f"folder {missing} does not exist" in caught.value.message
    assert f"create {missing}" in caught.value.fix


async def test_spawn_of_a_script_that_exits_at_once_still_reports_its_start(
    host: Host, tmp_path: Path
) -> None:
    script = tmp_path / "quick.sh"
    await host.put(str(script), b"#!/bin/sh\necho bye\nexit 4\n", 0o755)
    spawned = await host.spawn(
        str(script), str(tmp_path / "q.log"), str(tmp_path / "q.pid"), cwd=str(tmp_path)
    )
    assert spawned.start_time > 0
    await _wait_for_line(host, str(tmp_path / "q.log"), "bye")
    info = await host.inspect(spawned.pid, spawned.start_time)
    assert info.state in (ProcState.GONE, ProcState.ZOMBIE)
    await host.stop(spawned.pid, start_time=spawned.start_time, timeout=5)  # nothing to stop: no error


async def test_stop_kills_the_whole_group_even_if_term_is_ignored(host: Host, tmp_path: Path) -> None:
    script = tmp_path / "stubborn.sh"
    body = "#!/bin/sh\ntrap '' TERM\nsleep 300 &\necho child $!\nwhile :; do sleep 1; done\n"
    await host.put(str(script), body.encode(), 0o755)
    log = tmp_path / "stubborn.log"
    spawned = await host.spawn(str(script), str(log), str(tmp_path / "st.pid"), cwd=str(tmp_path))
    line = await _wait_for_line(host, str(log), "child ")
    child = int(line.split()[1])
    assert (await host.inspect(child)).state is ProcState.RUNNING
    await host.stop(spawned.pid, start_time=spawned.start_time, timeout=1)
    assert (await host.inspect(spawned.pid, spawned.start_time)).state is not ProcState.RUNNING
    assert (await host.inspect(child)).state is not ProcState.RUNNING


async def test_stop_sweeps_a_group_whose_leader_has_exited_and_says_what_it_swept(
    host: Host, tmp_path: Path
) -> None:
    """As vLLM's helpers after Slurm ended their job: the leader is gone, its children (reparented to init)
    still run in its group; `stop` of the leader's PID stops them and returns their PIDs."""
    script = tmp_path / "orphans.sh"
    body = "#!/bin/sh\nfor i in 1 2; do (trap '' TERM; exec sleep 300) & echo child $!; done\necho left\n"
    await host.put(str(script), body.encode(), 0o755)
    log = tmp_path / "orphans.log"
    spawned = await host.spawn(str(script), str(log), str(tmp_path / "o.pid"), cwd=str(tmp_path))
    await _wait_for_line(host, str(log), "left")
    children = [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("child ")]
    while True:  # the leader exits after its last line
        if (await host.inspect(spawned.pid, spawned.start_time)).state is not ProcState.RUNNING:
            break
        await asyncio.sleep(0.1)
    assert [(await host.inspect(c)).state for c in children] == [ProcState.RUNNING] * 2
    assert sorted(await host.stop(spawned.pid, start_time=spawned.start_time, timeout=1)) == sorted(children)
    assert ProcState.RUNNING not in [(await host.inspect(c)).state for c in children]
    assert await host.stop(spawned.pid, start_time=spawned.start_time, timeout=1) == []  # nothing left


async def test_tail_and_follow(host: Host, tmp_path: Path) -> None:
    log = tmp_path / "follow.log"
    log.write_text("old 1\nold 2\n")
    assert await host.tail(str(log), 1) == "old 2\n"
    lines = host.follow(str(log), poll_s=0.1)
    first = asyncio.ensure_future(anext(lines))
    written: list[str] = []
    async with asyncio.timeout(20):  # tail reports only what is appended once it runs: append until it does
        while not first.done():
            written.append(f"new {len(written) + 3}")
            with log.open("a") as fh:
                fh.write(written[-1] + "\n")
            await asyncio.wait({first}, timeout=0.2)
    assert first.result() in written  # an appended line, never one of the old ones
    await lines.aclose()  # type: ignore[attr-defined]
    with pytest.raises(CommandError, match="cannot read"):
        await host.tail(str(tmp_path / "missing.log"))


async def test_follow_with_last_lines_is_one_tail(host: Host, tmp_path: Path) -> None:
    """`follow(last=N)`: the last N lines, then the appended ones, from one `tail -F` (none lost between)."""
    log = tmp_path / "follow-last.log"
    log.write_text("old 1\nold 2\nold 3\n")
    lines = host.follow(str(log), poll_s=0.1, last=2)
    assert [await asyncio.wait_for(anext(lines), 20) for _ in range(2)] == ["old 2", "old 3"]
    with log.open("a") as fh:
        fh.write("new 4\n")
    assert await asyncio.wait_for(anext(lines), 20) == "new 4"
    await lines.aclose()  # type: ignore[attr-defined]


async def test_closed_host_refuses_use(ssh_hosts: list[SshdHost]) -> None:
    host = open_host(ssh_hosts[0].entry())
    async with host:
        states = [host.state]
    states.append(host.state)
    assert states == [HostState.OPEN, HostState.CLOSED]
    with pytest.raises(RemoteError, match="was closed"):
        await host.run(["true"])
    with pytest.raises(RemoteError, match="was closed"):
        async with host:
            pass


async def _wait_for_argv(host: Host, pid: int, start_time: int, argv: tuple[str, ...]) -> ProcInfo:
    """The script `exec`s into its final argv a moment after spawn returns: poll (bounded) until it has."""
    for _ in range(200):
        info = await host.inspect(pid, start_time)
        if info.argv == argv or info.state is not ProcState.RUNNING:
            return info
        await asyncio.sleep(0.05)
    return info


async def _wait_for_line(host: Host, path: str, needle: str) -> str:
    for _ in range(200):
        for line in (await host.tail(path, 50)).splitlines():
            if needle in line:
                return line
        await asyncio.sleep(0.05)
    raise AssertionError(f"{needle!r} never appeared in {path}: {await host.tail(path, 50)!r}")
