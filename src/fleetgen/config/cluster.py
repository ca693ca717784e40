"""`[cluster]`: the servers are placed by a cluster scheduler, one table per kind (`slurm`, `ray`), told
apart by `kind` (a pydantic discriminated union: a key of another kind is refused at its line).

`kind` is required: a `[cluster]` without it, or with a kind fleetgen has no placement for, is refused
naming the kinds. No default kind: the first release with `[cluster]` required `kind = "slurm"` too, so every
file written for it names its kind, and a default would read a Ray table's typo as a Slurm one."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import Discriminator, Tag

from fleetgen.config.ray import RayCluster
from fleetgen.config.slurm import SlurmCluster

CLUSTER_KINDS: tuple[str, ...] = tuple(
    get_args(m.model_fields["kind"].annotation)[0] for m in (SlurmCluster, RayCluster)
)


def _kind_of(value: Any) -> str | None:
    return value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)


ClusterConfig = Annotated[
    Annotated[SlurmCluster, Tag("slurm")] | Annotated[RayCluster, Tag("ray")],
    Discriminator(
        _kind_of,
        custom_error_type="cluster_kind",
        custom_error_message=(
            f"[cluster] needs kind = {' or '.join(map(repr, CLUSTER_KINDS))} (what places the servers: "
            'a Slurm cluster or a Ray cluster); add the line `kind = "slurm"` or `kind = "ray"`'
        ),
    ),
]
