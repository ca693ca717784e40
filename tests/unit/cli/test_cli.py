"""`fleetgen` imports only the topic module of the command it runs: the command → topic map must be true."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleetgen.cli import COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_is_registered_by_its_topic_alone(command: str) -> None:
    """In a fresh interpreter, registering one command's topic makes exactly that command resolvable."""
    code = (
        "import sys, typer.main\n"
        "from fleetgen.cli import register\n"
        "from fleetgen.cli.app import app\n"
        f"register([{command!r}])\n"
        "group = typer.main.get_command(app)\n"
        f"sys.exit(0 if {command!r} in group.commands else 3)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_help_registers_every_command() -> None:
    code = (
        "import sys, typer.main\n"
        "from fleetgen.cli import COMMANDS, register\n"
        "from fleetgen.cli.app import app\n"
        "register(['--help'])\n"
        "sys.exit(0 if set(COMMANDS) <= set(typer.main.get_command(app).commands) else 3)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
