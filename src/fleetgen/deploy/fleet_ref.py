"""`Fleet`: a fleet file as every command past `plan` holds it, read once by the CLI (`cli.app.read_fleet`)
and passed down to deploy, fleet, generate, bench and tune, which never read the file again.

One name per layer: `config.FleetFile` is the file's content (pydantic), `Fleet` is that content with its path
(where the fleet's state lives: `.fleetgen/` beside it) and its engine looked up once; a parameter holding a
`FleetFile` is named `fleet_file`, a `Path` to the file `fleet_path`; the `fleetgen.fleet` package is the live
view of a running fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetgen.config import FleetFile, load_fleet
from fleetgen.engines import Engine, get_engine


@dataclass(frozen=True)
class Fleet:
    """A loaded fleet file, its engine and where its state lives."""

    path: Path
    file: FleetFile
    engine: Engine

    @classmethod
    def load(cls, path: Path) -> Fleet:
        file = load_fleet(path)
        return cls(path=path, file=file, engine=get_engine(file.engine.kind))
