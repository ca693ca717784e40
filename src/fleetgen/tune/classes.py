"""GPU classes: the instances whose GPUs want the same settings (pure).

The right settings differ between a 96 GB and a 183 GB GPU (the Mamba pool and the KV each job request needs
fill them differently), and between tp 1 and tp 2; identical GPUs want the same, so `tune` measures per
class and several candidates at once on a class's several instances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetgen.errors import ConfigError
from fleetgen.plan.types import GIB, HostFacts, InstancePlan


@dataclass(frozen=True, order=True)
class GpuClass:
    """GPUs alike for tuning: their total memory (whole GiB) and how many one instance spans."""

    total_gib: int
    tp: int

    @property
    def name(self) -> str:
        return f"{self.total_gib} GiB" + (f" × tp {self.tp}" if self.tp > 1 else "")


def gpu_class(plan: InstancePlan, facts: HostFacts) -> GpuClass:
    """The class of one instance: its first GPU's total memory as measured (else the fleet file's)."""
    by_index = {g.index: g for g in facts.gpus or ()}
    gpu = by_index.get(plan.gpus[0])
    if gpu is None:
        raise ConfigError(
            f"{plan.instance}: the memory of GPU {plan.gpus[0]} of {plan.host} is not known, so its GPU "
            "class (what settings suit it) is not either",
            fix=f"make {plan.host} reachable (tune reads nvidia-smi there), or set gpu_memory_gib for it "
            "in the fleet file",
            context={"host": plan.host},
        )
    return GpuClass(round(gpu.total_bytes / GIB), len(plan.gpus))


def group_by_class(
    plans: Sequence[InstancePlan], facts: Mapping[str, HostFacts]
) -> dict[GpuClass, list[InstancePlan]]:
    """The instances of each GPU class (largest GPUs first), each host in one class: a host's settings are
    one `engine_args`, so a host that mixes GPU classes is refused, naming it."""
    groups: dict[GpuClass, list[InstancePlan]] = {}
    host_class: dict[str, GpuClass] = {}
    for plan in plans:
        cls = gpu_class(plan, facts[plan.host])
        seen = host_class.setdefault(plan.host, cls)
        if seen != cls:
            raise ConfigError(
                f"{plan.host} mixes GPU classes ({seen.name} and {cls.name}): tune chooses one set of flags "
                "per host, which cannot suit both",
                fix=f"split {plan.host} into two [[hosts]] entries (same ssh, each listing its GPUs of one "
                "kind)",
                context={"host": plan.host},
            )
        groups.setdefault(cls, []).append(plan)
    return dict(sorted(groups.items(), reverse=True))
