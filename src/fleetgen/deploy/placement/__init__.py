"""The placement registry: what places a fleet's servers, by `[cluster] kind` ("hosts" for `[[hosts]]`).

Each placement is one module here implementing `base.Placement` (launch_survey, preflight, up, down, place,
the GPUs it offers for planning), listed once in `PLACEMENTS`; a command looks its fleet's up once
(`placement_of`) and calls it, so no module outside this package asks which placement a fleet has
(ARCHITECTURE.md, "Adding a placement").
"""

from __future__ import annotations

from fleetgen.config import FleetFile
from fleetgen.deploy.placement import hosts, ray, slurm
from fleetgen.deploy.placement.base import Placed, Placement
from fleetgen.errors import ConfigError

PLACEMENTS: dict[str, Placement] = {p.kind: p for p in (hosts.PLACEMENT, slurm.PLACEMENT, ray.PLACEMENT)}

__all__ = ["PLACEMENTS", "Placed", "Placement", "placement_of"]


def placement_of(fleet_file: FleetFile) -> Placement:
    """The placement of `fleet_file`'s servers (`FleetFile.placement_kind`)."""
    kind = fleet_file.placement_kind
    try:
        return PLACEMENTS[kind]
    except KeyError:
        raise ConfigError(
            f"no placement registered for [cluster] kind = {kind!r}",
            fix="register its module in fleetgen/deploy/placement/__init__.py "
            f"(known: {', '.join(PLACEMENTS)})",
        ) from None
