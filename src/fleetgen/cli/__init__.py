"""fleetgen's command line: `fleetgen <command>`. Each topic module registers its commands on `cli.app`."""

from __future__ import annotations

import importlib
import sys

from fleetgen.cli.app import app as _app  # `fleetgen.cli.app` stays the module topics import as `cli`

# Topic module → the commands it registers. Importing only the one a command needs keeps `fleetgen run`
# from loading asyncssh, pyarrow and the dashboard it does not use (about 0.5 s of CPU per start).
TOPICS: dict[str, tuple[str, ...]] = {
    "init": ("init",),
    "hosts": ("hosts",),
    "plan": ("plan",),
    "deploy": ("up", "down", "restart", "status", "logs"),
    "run": ("run",),
    "export": ("export",),
    "bench": ("bench",),
    "tune": ("tune",),
    "dashboard": ("dashboard", "report"),
}
COMMANDS = {command: topic for topic, commands in TOPICS.items() for command in commands}
_TOPICS = tuple(TOPICS)


def register(argv: list[str]) -> None:
    """Register the topic of the command in `argv` — every topic when it names none (help, typos)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    topics = [COMMANDS[command]] if command in COMMANDS else _TOPICS
    for topic in topics:
        importlib.import_module(f"fleetgen.cli.{topic}")


def main() -> None:
    register(sys.argv[1:])
    _app()
