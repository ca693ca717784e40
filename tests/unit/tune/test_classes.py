"""`tune.classes`: instances grouped by GPU memory and tp, a host mixing classes refused.

Once test_tune.py ("tune's pure parts"), split by module: test_search.py, test_verdict.py,
test_fleetfile.py, test_measure.py, test_session.py; what they share is _helpers.py.
"""

from __future__ import annotations

import pytest

from fleetgen.errors import ConfigError
from fleetgen.plan import GpuFacts, HostFacts, facts_from_file, plan_fleet
from fleetgen.tune.classes import group_by_class
from tests.unit.tune._helpers import GIB, QWEN, fleet_file

# --- GPU classes -------------------------------------------------------------------------------------------


def test_instances_group_by_gpu_memory_and_tp_largest_first() -> None:
    fleet = fleet_file(
        [
            {"name": "small", "gpus": [0, 1], "gpu_memory_gib": 95.6},
            {"name": "big", "gpus": [0], "gpu_memory_gib": 179.1},
            {"name": "small2", "gpus": [3], "gpu_memory_gib": 95.6},
        ]
    )
    facts = {h.name: facts_from_file(h) for h in fleet.hosts}
    plan = plan_fleet(fleet, QWEN, facts)
    groups = group_by_class(plan.instances, facts)
    assert [(c.name, [p.instance for p in ps]) for c, ps in groups.items()] == [
        ("179 GiB", ["big-0"]),
        ("96 GiB", ["small-0", "small-1", "small2-0"]),
    ]


def test_a_host_mixing_gpu_classes_is_refused_naming_it() -> None:
    fleet = fleet_file([{"name": "mixed", "gpus": [0, 1]}])
    gpus = (GpuFacts(0, 96 * GIB, 96 * GIB, True), GpuFacts(1, 180 * GIB, 180 * GIB, True))
    facts = {"mixed": HostFacts("mixed", gpus)}
    plan = plan_fleet(fleet, QWEN, facts)
    with pytest.raises(ConfigError, match="mixed mixes GPU classes") as exc:
        group_by_class(plan.instances, facts)
    assert "split mixed into two" in exc.value.fix


def test_an_unknown_gpu_memory_is_refused_with_the_fix() -> None:
    fleet = fleet_file([{"name": "dark", "gpus": [0]}])
    facts = {"dark": HostFacts("dark")}
    plan = plan_fleet(fleet, QWEN, facts)
    with pytest.raises(ConfigError, match="not known") as exc:
        group_by_class(plan.instances, facts)
    assert "gpu_memory_gib" in exc.value.fix
