"""No Python warning reaches a user (issue 30): every command's `--help`, and real error paths through the
libraries each command loads (asyncssh's connect, aiohttp, pyarrow, the job store), run as a user runs them —
a subprocess with Python's default warning filters (no `-W`, no PYTHONWARNINGS) — print on stderr nothing but
fleetgen's own lines. cryptography 51 made asyncssh's import print five `CryptographyDeprecationWarning: DSA
is deprecated` lines before every command's output; `fleetgen.remote.sshlib` filters exactly that."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.cli import COMMANDS
from tests.fixtures.ports import free_port

# `hosts` is a group: its commands' help too.
HELPS = [[c] for c in COMMANDS] + [["hosts", "check"], []]


def fleetgen(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`fleetgen ARGS` as a user's shell runs it: Python's default warning filters, stdout/stderr to pipes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=120, check=False)


def assert_only_fleetgens_error(done: subprocess.CompletedProcess[str]) -> None:
    """stderr is one rendered error: its `error:` line, then only its indented context and fix lines."""
    first, *rest = done.stderr.splitlines() or [""]
    assert first.startswith("error: "), done.stderr
    assert all(line.startswith("  ") for line in rest), done.stderr
    assert "Warning" not in done.stderr, done.stderr


@pytest.mark.parametrize("command", HELPS, ids=lambda c: " ".join(c) or "fleetgen")
def test_every_commands_help_prints_nothing_on_stderr(tmp_path: Path, command: list[str]) -> None:
    done = fleetgen(*command, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "Usage:" in done.stdout


@pytest.fixture
def unreachable_fleet(tmp_path: Path) -> Path:
    """A fleet file whose one host's port has no listener: every SSH connect is refused at once."""
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[engine]\nkind = "sglang"\nmodel = "/nonexistent/model"\n\n'
        f'[[hosts]]\nname = "a"\nssh = "root@127.0.0.1:{free_port()}"\ngpus = [0]\n'
    )
    return path


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["plan", "-f", "{fleet}"], "cannot reach host a"),  # asyncssh connects, and is refused
        (["logs", "--fleet", "{fleet}", "a-9"], "a-9"),
        (["bench", "-f", "{fleet}"], "no instance of the fleet is ready"),
        (["export", "{tmp}/none"], "results.sqlite missing"),
        (["report", "{tmp}/none"], "results.sqlite missing"),
        (["run", "{tmp}/fleet.toml", "-o", "{fleet}", "--endpoint", "http://127.0.0.1:9"], "is a file"),
        (["tune", "-f", "{fleet}", "--job", "{tmp}/none.toml", "{tmp}/none.jsonl"], "none.toml"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_a_real_error_path_prints_fleetgens_error_and_nothing_else(
    tmp_path: Path, unreachable_fleet: Path, command: list[str], says: str
) -> None:
    argv = [a.format(fleet=unreachable_fleet, tmp=tmp_path) for a in command]
    done = fleetgen(*argv, cwd=tmp_path)
    assert done.returncode != 0
    assert_only_fleetgens_error(done)
    assert says in done.stderr.splitlines()[0]
