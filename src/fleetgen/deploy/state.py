"""What fleetgen launched, kept in `.fleetgen/state.json` next to the fleet file.

State is a record, never the truth: `status` and `up` re-read every process from its host and use the state
only to know which PID (and start time, to tell a reused PID) to look at. It never holds a secret: only the
NAMES of the environment variables are stored (values may be tokens a user put in engine.env), and the argv
as rendered, where an API key is a `${NAME}` reference.
Writes are atomic (`atomic.write_atomic`: temp file + fsync + rename) so a crash mid-write leaves the previous
state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from fleetgen.atomic import write_atomic
from fleetgen.errors import ConfigError

SCHEMA_VERSION = 2


def _placement_id(record: dict[str, Any]) -> dict[str, Any]:
    """Schema 2: a cluster's job (Slurm's, the only one then) became a placement id (Slurm's job, Ray's
    actor)."""
    job = record.pop("slurm_job", "")
    return {**record, "placement_id": record.get("placement_id", job)}


# Schema changes, in order, append-only: MIGRATIONS[v - 1] takes a record of schema v to v + 1.
MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [_placement_id]


@dataclass(frozen=True)
class InstanceRecord:
    """One launched instance as recorded at launch time."""

    instance: str
    host: str
    gpus: tuple[int, ...]
    port: int
    pid: int
    start_time: int
    log_path: str
    script_path: str
    script_sha256: str
    launched_at: str
    argv: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()
    engine_version: str | None = None  # the version that decided argv (the host's, else engine.version)
    rule_set: str = ""  # the rule set read for it (`sglang-0.5.23`)
    placement_id: str = ""  # a cluster's: the Slurm job or Ray actor that runs it (pid 0 until it started)
    node: str = ""  # a cluster's: the node it runs on


# `asdict` writes a record; this reads it back (JSON lists → tuples), refusing a record that lacks a field.
_RECORDS = TypeAdapter(dict[str, InstanceRecord])


def state_path(fleet_path: Path) -> Path:
    return fleet_path.resolve().parent / ".fleetgen" / "state.json"


def load_state(fleet_path: Path) -> dict[str, InstanceRecord]:
    """The recorded instances by name; empty when nothing was launched yet."""
    path = state_path(fleet_path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        records = data.get("instances", {})
        for migrate in MIGRATIONS[int(data.get("schema", 1)) - 1 :]:
            records = {name: migrate(dict(rec)) for name, rec in records.items()}
        return _RECORDS.validate_python(records)
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f"cannot read fleetgen's state {path}: {exc}",
            fix=f"move {path} aside; `fleetgen up` re-creates it (running servers are "
            "re-checked against the fleet file)",
        ) from exc


def update_state(fleet_path: Path, put: Iterable[InstanceRecord] = (), drop: Iterable[str] = ()) -> None:
    """Upsert `put` and remove `drop` (instance names), keeping every other record."""
    records = load_state(fleet_path)
    for name in drop:
        records.pop(name, None)
    for rec in put:
        records[rec.instance] = rec
    payload = {
        "schema": SCHEMA_VERSION,
        "fleet_file": str(fleet_path.resolve()),
        "instances": {name: asdict(rec) for name, rec in sorted(records.items())},
    }
    write_atomic(state_path(fleet_path), json.dumps(payload, indent=2, sort_keys=True) + "\n")
