"""The pure memory plan and flag rules: `plan_fleet(fleet, shape, facts, version) -> FleetPlan`.

Modules: `types` (values in and out), `planners` (engine name → `Planner`), each engine's own arithmetic and
rules (`sglang/`, `vllm`), `instance` (one instance), `fixes` (ranked fixes, target concurrency), `fleet` (the
whole fleet and cross-instance rules).
"""

from __future__ import annotations

from fleetgen.plan.fleet import cross_instance_errors, engine_rejections, facts_from_file, plan_fleet
from fleetgen.plan.instance import API_KEY_CONFIG, Launch, decide_launch
from fleetgen.plan.types import FleetPlan, GpuFacts, HostFacts, InstancePlan, Issue

__all__ = [
    "API_KEY_CONFIG",
    "FleetPlan",
    "GpuFacts",
    "HostFacts",
    "InstancePlan",
    "Issue",
    "Launch",
    "cross_instance_errors",
    "decide_launch",
    "engine_rejections",
    "facts_from_file",
    "plan_fleet",
]
