"""`[cluster] kind = "ray"`: the servers are placed by a Ray cluster (on VMs, or on Kubernetes through
KubeRay): one placement group of `tp` GPUs on one node (STRICT_PACK) per server, held by a detached actor
(`deploy.placement.ray`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from fleetgen.config.hosts import HostName, Machine, gpus_problems

# `auto` (the cluster this machine is a node of), `ray://head:10001` (Ray Client), or the GCS `host:port`
RAY_ADDRESS = re.compile(r"^(?:auto|ray://[^\s/:]+(?::\d{1,5})?|[^\s/:]+:\d{1,5})$")
# resources fleetgen asks for itself (the server's GPUs) or Ray manages (`node:<ip>` pins, bundle ids)
MANAGED_RESOURCES = {"GPU", "CPU", "memory", "object_store_memory"}


class RayCluster(Machine):
    """`[cluster] kind = "ray"`: the servers are placed by a Ray cluster, one placement group per server.

    fleetgen is the driver (`ray.init(address)`, Ray's public API only, so a KubeRay cluster works the same);
    each server's node is reached by Ray tasks pinned to it (`remote.ray.RayHost`), so the workdir is the
    node's own. Instances are named `<name>-<k>` (k < gpus / engine.tp) and listen on `base_port + k` on
    their node.
    """

    kind: Literal["ray"]
    name: HostName = "ray"
    address: Annotated[str, Field(pattern=RAY_ADDRESS.pattern)] = "auto"
    gpus: Annotated[int, Field(ge=1, le=65536)]
    namespace: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] = "fleetgen"
    resources: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    pending_timeout_s: Annotated[float, Field(gt=0)] = 600.0  # `up` waits this long for a placement group

    # Ray hands each actor its GPUs (and sets CUDA_VISIBLE_DEVICES): the launch exports none of its own
    assigns_devices: ClassVar[bool] = True

    @field_validator("resources")
    @classmethod
    def _unmanaged(cls, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if name in MANAGED_RESOURCES or name.startswith("node:"):
                raise ValueError(
                    f"resource {name!r} is set by fleetgen or Ray: remove it (a server asks for engine.tp "
                    "GPUs; name custom resources only, or pick nodes with labels)"
                )
        return value

    @field_validator("runtime_env")
    @classmethod
    def _no_env_vars(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "env_vars" in value:
            raise ValueError(
                "runtime_env.env_vars is refused: Ray keeps a runtime env in its cluster metadata, readable "
                "by every job on the cluster; put the engine's variables in [engine.env] (the launch script "
                "exports them; the API key travels in 0600 files, as for SSH hosts)"
            )
        return value

    def submit_host(self) -> dict[str, Any]:
        """The `[[hosts]]` entry the cluster stands for: this machine, the Ray driver, its GPUs the
        cluster's (slots 0…gpus-1, one instance per `tp` of them; Ray picks node and devices)."""
        values = self.model_dump(include={"name", *Machine.model_fields}, exclude_none=True)
        return {**values, "ssh": "local", "gpus": list(range(self.gpus))}

    def problems(self, tp: int) -> list[tuple[tuple[int | str, ...], str]]:
        """The cluster's GPUs `tp` does not divide."""
        return gpus_problems(self.gpus, tp)
