"""`deploy.placement`: the registry has a placement for every kind a fleet file may name, and nothing outside
the placement package (and the config that parses `[cluster]`) asks which placement a fleet has: the seam
is the only branch (issue 33 counted 7 `cluster is not None` branches in 6 modules before it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetgen.config import CLUSTER_KINDS, FleetFile
from fleetgen.deploy.placement import PLACEMENTS, placement_of
from fleetgen.errors import ConfigError

SRC = Path(__file__).resolve().parents[4] / "src" / "fleetgen"
# Asking a fleet file for its cluster, or naming one placement's module, outside the seam.
BRANCH = re.compile(r"\.cluster\b|fleetgen\.deploy\.placement\.(?!base\b)\w+|deploy\.slurm\b")
SEAM = ("config/", "deploy/placement/")

ENGINE = {"kind": "sglang", "model": "/m", "tp": 1}
TABLES = {
    "slurm": {"kind": "slurm", "partition": "gpu", "gpus": 2, "time": "10"},
    "ray": {"kind": "ray", "gpus": 2},
}


def test_every_kind_a_fleet_file_may_name_has_its_placement() -> None:
    assert set(TABLES) == set(CLUSTER_KINDS)
    assert set(PLACEMENTS) == {"hosts", *CLUSTER_KINDS}
    assert all(kind == p.kind for kind, p in PLACEMENTS.items())


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_a_cluster_fleet_is_placed_by_its_kind_and_hands_out_the_devices(kind: str) -> None:
    fleet = FleetFile.model_validate({"engine": ENGINE, "cluster": TABLES[kind]})
    assert placement_of(fleet).kind == kind and placement_of(fleet).is_per_instance
    assert fleet.assigns_devices  # the cluster sets CUDA_VISIBLE_DEVICES: the launch exports none


def test_a_hosts_fleet_is_placed_on_its_hosts_with_its_listed_gpus() -> None:
    fleet = FleetFile.model_validate({"engine": ENGINE, "hosts": [{"name": "h", "gpus": [0, 1]}]})
    placement = placement_of(fleet)
    assert placement.kind == "hosts" and not placement.is_per_instance and not fleet.assigns_devices


def test_a_kind_without_a_placement_names_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = FleetFile.model_validate({"engine": ENGINE, "cluster": TABLES["slurm"]})
    monkeypatch.delitem(PLACEMENTS, "slurm")
    with pytest.raises(
        ConfigError, match=r"no placement registered for \[cluster\] kind = 'slurm'"
    ) as caught:
        placement_of(fleet)
    assert "fleetgen/deploy/placement/__init__.py" in caught.value.fix


def test_no_module_outside_the_seam_asks_which_placement_a_fleet_has() -> None:
    found = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if not str(path.relative_to(SRC)).startswith(SEAM)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BRANCH.search(line)
    ]
    assert found == []
