"""`deploy.placement.raynodes` (pure): the one survey a Ray fleet's servers are launched by is what the nodes
Ray may place them on run, never the driver's; a node of another engine release (or another resolved
workdir) is refused by name, in `hosts check`'s words, before anything is placed. (On a real Ray cluster:
tests/integration/deploy/test_ray_fleet.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from fleetgen.config import EngineConfig
from fleetgen.deploy.hostsurvey import GpuInfo, HostSurvey
from fleetgen.deploy.placement.raynodes import launch_survey, launch_version, version_refusal
from fleetgen.errors import LaunchFailed
from fleetgen.remote.ray import RayNode

RELEASES = ["0.5.7", "0.5.9", "0.5.10", "0.5.23", "0.5.8.post1", None]  # 0.5.9 < 0.5.10: no string order
DRIVER = HostSurvey(
    workdir="/home/driver/fleetgen",
    has_nvidia_smi=True,
    uptime_s=1.0,
    clk_tck=100,
    engine_version="0.4.0",  # the driver's own engine: none of the servers'
    mem_available_bytes=7 << 30,
    gpu_rows=(GpuInfo(0, "H100", 81559, 0),),
    python_version="3.11.9",
)


def engine(version: str | None = None) -> EngineConfig:
    values = {"kind": "sglang", "python": "/opt/venv/bin/python", "model": "/m", "version": version}
    return EngineConfig.model_validate({k: v for k, v in values.items() if v is not None})


def node(k: int) -> RayNode:
    return RayNode(f"{k:08x}cafe", f"10.0.0.{k + 1}", 8.0, {}, is_alive=True)


def on_node(version: str | None, workdir: str = "/home/ray/fleetgen") -> HostSurvey:
    return HostSurvey(workdir, False, 1.0, 100, engine_version=version, python_version="3.12.1")


@given(st.lists(st.sampled_from(RELEASES), min_size=1, max_size=5), st.sampled_from([None, "0.5", "0.5.9"]))
def test_the_launch_takes_what_the_nodes_run_and_refuses_by_name_each_node_of_another(
    versions: list[str | None], wanted: str | None
) -> None:
    cfg = engine(wanted)
    surveyed = [(node(k), on_node(v)) for k, v in enumerate(versions)]
    chosen = launch_version(cfg, versions)
    read = [v for v in versions if v]
    assert (chosen is None) == (not read) and (chosen is None or chosen in read)
    named = [v for v in read if wanted and v.startswith(wanted)]
    if chosen is not None:  # the newest of those engine.version names, else of all (0.5.10 > 0.5.9)
        assert all(Version(chosen) >= Version(v) for v in named or read)
        assert not named or chosen.startswith(str(wanted))
    differ = [n for n, s in surveyed if chosen and s.engine_version != chosen]
    if not differ:
        got = launch_survey(cfg, DRIVER, surveyed)
        assert got.engine_version == chosen and got.workdir == "/home/ray/fleetgen"
        assert got.gpu_rows == () and got.mem_available_bytes is None  # no figure of the driver's
        return
    with pytest.raises(LaunchFailed) as refused:
        launch_survey(cfg, DRIVER, surveyed)
    said = refused.value.message
    assert [n.label for n, _ in surveyed if n.label in said] == [n.label for n in differ]
    assert f"the plan expects {chosen}" in said and "before anything was placed" in said
    assert f"install sglang=={chosen} there" in (refused.value.fix or "")


def test_a_prefix_engine_version_covers_its_releases_as_hosts_check_reads_it() -> None:
    assert version_refusal(engine("0.5"), node(0), "0.5.23", "0.5") is None
    assert version_refusal(engine(), node(0), "0.5.23", None) is None  # nothing known: nothing to refuse
    refused = version_refusal(engine(), node(0), None, "0.5.23")
    assert refused is not None and "has sglang (none installed), the plan expects 0.5.23" in refused.message


def test_nodes_that_resolve_the_workdir_elsewhere_are_refused_with_the_fix() -> None:
    surveyed = [(node(0), on_node("0.5.23", "/home/ray/w")), (node(1), on_node("0.5.23", "/root/w"))]
    with pytest.raises(LaunchFailed) as refused:
        launch_survey(engine(), DRIVER, surveyed)
    assert node(0).label in refused.value.message and node(1).label in refused.value.message
    assert "absolute path" in (refused.value.fix or "")
