"""fleetgen's command line: `fleetgen <command>`. Each topic module registers its commands on `app`."""

from __future__ import annotations

import importlib
import sys

from fleetgen.cli.app import app

# Command → the topic module that registers it. Importing only the one a command needs keeps `fleetgen run`
# from loading asyncssh, pyarrow and the dashboard it does not use (about 0.5 s of CPU per start).
COMMANDS: dict[str, str] = {
    "init": "init",
    "hosts": "hosts",
    "plan": "plan",
    "up": "deploy",
    "down": "deploy",
    "restart": "deploy",
    "status": "deploy",
    "logs": "deploy",
    "run": "run",
    "export": "run",
    "bench": "bench",
    "dashboard": "dashboard",
    "report": "dashboard",
}
_TOPICS = tuple(dict.fromkeys(COMMANDS.values()))


def register(argv: list[str]) -> None:
    """Register the topic of the command in `argv` — every topic when it names none (help, typos)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    topics = [COMMANDS[command]] if command in COMMANDS else _TOPICS
    for topic in topics:
        importlib.import_module(f"fleetgen.cli.{topic}")


def main() -> None:
    register(sys.argv[1:])
    app()
