"""One convention for boolean options on every command (issue 10 item 14): `--NAME` / `--no-NAME`, both
spellings in help, never `<bool>` (which reads as "takes a value"), and both spellings parse.

Filed under `cli/app.py` (the app every topic registers its options on)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import typer

from fleetgen.cli import COMMANDS, register
from fleetgen.cli.app import app

register([])  # every topic module
ROOT: Any = typer.main.get_command(app)  # typer's own (vendored) click group


def commands(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every command by its full name ("hosts check"), nested groups included."""
    out: dict[str, Any] = {}
    for name, command in group.commands.items():
        full = f"{prefix}{name}"
        out |= commands(command, full + " ") if hasattr(command, "commands") else {full: command}
    return out


COMMAND = commands(ROOT)


def bool_options() -> list[tuple[str, Any]]:
    return [
        (name, p)
        for name in sorted(COMMAND)
        for p in COMMAND[name].params
        if getattr(p, "is_bool_flag", False)
    ]


BOOLS = bool_options()


def test_there_are_boolean_options_to_check() -> None:
    assert set(COMMANDS) <= {name.split()[0] for name in COMMAND}  # every command was registered
    assert {name for name, _ in BOOLS} >= {"run", "export", "status", "logs", "plan", "bench", "hosts check"}


@pytest.mark.parametrize(("command", "option"), BOOLS, ids=[f"{c}:{o.name}" for c, o in BOOLS])
def test_every_boolean_option_is_a_flag_pair_that_parses_both_ways(command: str, option: Any) -> None:
    longs = [o for o in option.opts if o.startswith("--")]
    assert len(longs) == 1, option.opts
    name = longs[0][2:]
    assert option.secondary_opts == [f"--no-{name}"]
    cmd = COMMAND[command]
    for spelling, expected in ((f"--{name}", True), (f"--no-{name}", False)):
        ctx = cmd.make_context(command, [spelling], resilient_parsing=True)
        assert ctx.params[option.name] is expected, (spelling, ctx.params)


@pytest.mark.parametrize("command", sorted({c for c, _ in BOOLS}))
def test_help_shows_both_spellings_and_no_bool_metavar(command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"COLUMNS": "200"}
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", *command.split(), "--help"]
    text = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=60).stdout
    for name, option in BOOLS:
        if name != command:
            continue
        row = next(line for line in text.splitlines() if option.opts[0] in line.split())
        assert option.secondary_opts[0] in row.split() and "<bool>" not in row, row


def test_a_value_after_a_flag_is_refused_the_same_way_everywhere() -> None:
    """`--no-live true` is not a spelling: the flag takes no value (the help says so by showing none)."""
    argv = [sys.executable, "-c", "from fleetgen.cli import main; main()", "run", "in.jsonl", "-o", "out"]
    done = subprocess.run(
        [*argv, "--no-live", "true"], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 2 and "true" in done.stderr
