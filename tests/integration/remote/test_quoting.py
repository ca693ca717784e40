"""Property tests over real SSH: arbitrary strings reach the remote process byte-for-byte.

Quotes, `$`, backticks, backslashes, newlines, spaces, unicode and leading dashes as argv values, as env
values exported by a generated script (shlex.quote), as file contents and file names. One connection is
reused for all examples; example counts stay modest to keep CI fast.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.remote import ProcState, SshHost
from tests.fixtures.sshd import SshdHost

NASTY = [
    "'",
    '"',
    "$HOME",
    "${PATH}",
    "`id`",
    "$(id)",
    "\\",
    "\\n",
    "\n",
    "\r",
    "\t",
    " ",
    "-n",
    "-e",
    "--",
    "-",
    "*",
    "?",
    "~",
    "!",
    ";",
    "&",
    "|",
    "<",
    ">",
    "#",
    "=",
    "ü",
    "日本語",
    "🙂",
    "\x01",
    "\x7f",
    "%s",
]
CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")  # argv/env cannot hold NUL
ARG = st.one_of(st.text(CHARS, max_size=30), st.lists(st.sampled_from(NASTY), max_size=6).map("".join))
ARGS = st.lists(ARG, max_size=6)
ENV = st.lists(ARG, max_size=4)
FILE_NAME = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00/"), min_size=1, max_size=40
).filter(lambda name: name not in {".", ".."})
EXAMPLES = settings(max_examples=30, deadline=None)
LAUNCHES = itertools.count()


@pytest.fixture(scope="module")
async def shared_host(ssh_hosts: list[SshdHost]) -> AsyncIterator[SshHost]:
    async with SshHost(ssh_hosts[1].entry()) as host:
        yield host


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quoting")


@EXAMPLES
@given(args=ARGS)
async def test_run_passes_argv_exactly(shared_host: SshHost, args: list[str]) -> None:
    result = await shared_host.run(["printf", "%s\\0", "first", *args])
    assert result.stdout.split("\0")[:-1] == ["first", *args]


@EXAMPLES
@given(args=ARGS, env=ENV)
async def test_spawned_process_sees_exact_argv_and_environ(
    shared_host: SshHost, scratch: Path, args: list[str], env: list[str]
) -> None:
    names = {f"FG_Q{k}": value for k, value in enumerate(env)}
    lines = ["#!/bin/sh", *(f"export {name}={shlex.quote(value)}" for name, value in names.items())]
    # `; :` keeps sh itself alive (no exec of the last command), so its argv is what /proc shows.
    lines.append(shlex.join(["exec", "/bin/sh", "-c", "sleep 600; :", "probe", *args]))
    run_id = hashlib.sha256(repr((args, env)).encode()).hexdigest()[:12]
    script = scratch / f"{run_id}.sh"
    await shared_host.put(str(script), ("\n".join(lines) + "\n").encode(), 0o755)
    log = scratch / f"{run_id}-{next(LAUNCHES)}.log"  # a new log per launch, even for a repeated example
    spawned = await shared_host.spawn(str(script), str(log), str(scratch / f"{run_id}.pid"), cwd=str(scratch))
    try:
        info = await shared_host.inspect(spawned.pid, spawned.start_time)
        for _ in range(50):  # the script may not have reached its `exec` yet
            if info.argv[:1] == ("/bin/sh",) and info.argv[2:3] == ("sleep 600; :",):
                break
            info = await shared_host.inspect(spawned.pid, spawned.start_time)
        assert info.state is ProcState.RUNNING
        assert info.argv == ("/bin/sh", "-c", "sleep 600; :", "probe", *args)
        assert {k: v for k, v in info.environ.items() if k.startswith("FG_Q")} == names
    finally:
        await shared_host.stop(spawned.pid, start_time=spawned.start_time, timeout=10)


@EXAMPLES
@given(data=st.binary(max_size=4096), name=FILE_NAME)
async def test_put_round_trips_bytes_and_names(
    shared_host: SshHost, scratch: Path, data: bytes, name: str
) -> None:
    target = scratch / "files" / name
    digest = await shared_host.put(str(target), data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert await asyncio.to_thread(target.read_bytes) == data
    assert await shared_host.read(str(target)) == data
