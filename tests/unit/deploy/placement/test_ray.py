"""`deploy.placement.ray`'s preflight arithmetic over what Ray lists (pure): the GPUs of the cluster's live
nodes that carry the fleet's labels against `cluster.gpus`, and a node wide enough for one server's
STRICT_PACK group. (The rest runs on a real Ray cluster: tests/integration/deploy/test_ray_fleet.py.)"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.config import RayCluster
from fleetgen.deploy.placement.ray import actor_name, gpu_problems
from fleetgen.remote.ray import RayNode

nodes = st.lists(
    st.builds(
        RayNode,
        node_id=st.text("0123456789abcdef", min_size=8, max_size=8),
        address=st.just("10.0.0.1"),
        gpus=st.integers(0, 8).map(float),
        labels=st.sampled_from([{}, {"gpu": "h100"}, {"gpu": "a10"}]),
        is_alive=st.booleans(),
    ),
    max_size=6,
)


@given(nodes, st.integers(1, 40), st.sampled_from([1, 2, 4, 8]), st.sampled_from([{}, {"gpu": "h100"}]))
def test_preflight_refuses_exactly_what_the_live_labelled_nodes_cannot_hold(
    listed: list[RayNode], gpus: int, tp: int, labels: dict[str, str]
) -> None:
    cluster = RayCluster.model_validate({"kind": "ray", "gpus": gpus, "labels": labels})
    usable = [n for n in listed if n.is_alive and all(n.labels.get(k) == v for k, v in labels.items())]
    total, widest = sum(int(n.gpus) for n in usable), max((int(n.gpus) for n in usable), default=0)
    found = gpu_problems(cluster, tp, listed)
    assert [p.message.startswith("cluster.gpus") for p in found] == [True] * (gpus > total) + [False] * (
        tp > widest
    )
    assert all(p.fix for p in found)


def test_actor_names_are_unique_per_fleet_file_and_instance() -> None:
    a, b = Path("/x/a/fleet.toml"), Path("/x/b/fleet.toml")
    names = {actor_name(p, i) for p in (a, b) for i in ("ray-0", "ray-1")}
    assert len(names) == 4 and all(n.startswith("fleetgen-ray-") for n in names)
