"""The plan layer's engine registry: each engine's plan arithmetic (`Planner`), by the engine's name.

An engine's planner lives next to its memory arithmetic (`plan/sglang/`, `plan/vllm/`) and is listed
here once; every engine in `fleetgen.engines.ENGINES` has one (engines sit left of plan and cannot
point here).
"""

from __future__ import annotations

from fleetgen.errors import ConfigError
from fleetgen.plan.sglang import planner as sglang
from fleetgen.plan.types import Planner
from fleetgen.plan.vllm import planner as vllm

PLANNERS: dict[str, Planner] = {p.engine.name: p for p in (sglang.PLANNER, vllm.PLANNER)}


def planner_of(engine: str) -> Planner:
    """The plan arithmetic of the engine registered as `engine`: looked up once, where a command starts
    planning (`plan_fleet`, `up`'s checks), and passed in from there."""
    try:
        return PLANNERS[engine]
    except KeyError:
        raise ConfigError(
            f"no plan arithmetic for engine {engine!r}",
            fix=f"register its Planner in fleetgen/plan/planners.py (known: {', '.join(PLANNERS)})",
        ) from None
