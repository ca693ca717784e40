"""What fleetgen prints off a terminal, as a user piping it to a file sees it (issue 10 item 11): one clean
error where a traceback was ("Event loop is closed"), no path split by wrapping, no table cell cut — whatever
COLUMNS says. Real subprocesses with stdout/stderr to pipes; real sshd hosts for `status`."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.sshd import SshdHost, write_fleet_toml

LONG = "a-folder-name-long-enough-that-eighty-columns-would-split-it-" * 2


def fleetgen(*args: str, columns: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def assert_clean(done: subprocess.CompletedProcess[str]) -> None:
    text = done.stdout + done.stderr
    assert "Traceback" not in text and "Event loop is closed" not in text, text
    assert done.stderr.startswith("error: "), done.stderr


@pytest.mark.parametrize("columns", [None, "20", "80"])
def test_run_and_export_into_an_existing_file_is_one_clean_error_naming_the_whole_path(
    tmp_path: Path, columns: str | None
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    target = tmp_path / LONG / "out.jsonl"
    target.parent.mkdir()
    target.write_text("not a folder\n")
    run = fleetgen(
        "run", str(prompts), "-o", str(target), "--endpoint", "http://127.0.0.1:9", columns=columns
    )
    assert run.returncode == 2
    assert_clean(run)
    assert f"-o {target} is a file" in run.stderr.splitlines()[0]  # one line: the path is not split
    assert target.read_text() == "not a folder\n"  # and nothing was written to it
    exported = fleetgen("export", str(target), columns=columns)
    assert exported.returncode == 2
    assert_clean(exported)
    assert str(target) in exported.stderr.splitlines()[0]


def test_an_unwritable_output_folder_is_a_clean_error_too(tmp_path: Path) -> None:
    """Any OSError reaching the command line (here: -o under a file) is one error line, not a traceback."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = fleetgen(
        "run", str(prompts), "-o", str(blocker / "out"), "--endpoint", "http://127.0.0.1:9", columns="20"
    )
    assert done.returncode == 1  # not the input's fault: exit 1 (2 is for wrong input)
    assert_clean(done)
    assert str(blocker / "out") in done.stderr.splitlines()[0]


def test_run_warns_before_generating_when_rows_can_outgrow_the_trainer(tmp_path: Path) -> None:
    """The job's max_length: max_tokens + the input's longest prompt past it is said with the numbers before
    any request (here no server answers after it: the warning still came first)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "' + "word " * 40 + '"}\n')
    job = tmp_path / "job.toml"
    job.write_text("max_tokens = 100\nmax_length = 64\n")
    out = str(tmp_path / "out")
    argv = ["run", str(prompts), "-o", out, "--job", str(job), "--endpoint", "http://127.0.0.1:9"]
    done = fleetgen(*argv, columns="200")
    warning = done.stderr.split("\n\n")[0]
    assert "[max-length] max_tokens 100 + the longest prompt" in warning, done.stderr
    assert "past the trainer's max_length 64" in warning and "fix: lower max_tokens to" in warning


@pytest.fixture
def two_host_fleet(ssh_hosts: list[SshdHost], tmp_path: Path) -> Path:
    """Two real sshd hosts, one instance each, nothing deployed (`status` says "not running")."""
    (tmp_path / LONG).mkdir()
    return write_fleet_toml(ssh_hosts[:2], tmp_path / LONG / "fleet.toml", python=sys.executable)


def test_status_only_with_a_name_unknown_on_one_host_is_one_clean_error(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    """`--only h0-0 --only h1-9`: h1's selection fails while h0 is still connecting (here: h0's "sshd"
    accepts TCP and never speaks, so its connect is still in flight). The failure used to close the session
    stack under h0's connect: a traceback ending in "Event loop is closed"."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        mute = dataclasses.replace(ssh_hosts[0], port=silent.getsockname()[1])
        fleet = write_fleet_toml([mute, ssh_hosts[1]], tmp_path / "fleet.toml", python=sys.executable)
        done = fleetgen("status", "-f", str(fleet), "--only", "h0-0", "--only", "h1-9", columns="20")
    assert done.returncode == 2, done.stderr
    assert_clean(done)
    assert "h1-9" in done.stderr.splitlines()[0]  # the unknown name, in the one error line


def test_status_table_off_a_terminal_is_never_cut(two_host_fleet: Path) -> None:
    for columns in (None, "20"):
        done = fleetgen("status", "-f", str(two_host_fleet), columns=columns)
        assert done.returncode == 1, done.stderr  # nothing deployed: not ready
        assert "Traceback" not in done.stderr
        assert "…" not in done.stdout  # no cell cut
        lines = done.stdout.splitlines()
        assert lines[0].split()[:3] == ["instance", "host", "gpus"] and lines[0].split()[-1] == "problem"
        rows = {line.split()[0]: line for line in lines[1:]}
        assert set(rows) == {"h0-0", "h1-0"}  # one line per instance: nothing wrapped
        assert all(row.rstrip().endswith("not running") for row in rows.values())  # the whole problem
