"""fleetgen's command line: `fleetgen <command>`. Each topic module registers its commands on `app`."""

from __future__ import annotations

import importlib

from fleetgen.cli.app import app

# Topic modules are added here as they land; each registers its commands on `app` when imported.
_TOPICS = ("init", "hosts", "plan", "deploy", "run", "bench", "dashboard")


def main() -> None:
    for topic in _TOPICS:
        try:
            importlib.import_module(f"fleetgen.cli.{topic}")
        except ModuleNotFoundError as exc:
            if exc.name != f"fleetgen.cli.{topic}":
                raise
    app()
