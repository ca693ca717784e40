"""Instance names, hosts and `--only`, attacked with host names that prefix each other (`gpu`, `gpu-1`, …).

Invariants, for every fleet file the loader accepts:
- every instance maps back to exactly its own host (`host_of_instance`), never by string prefix;
- no instance has a host's name, and instance names are unique;
- `--only` picks exactly the named instances plus every instance of the named hosts;
and a fleet whose names WOULD be ambiguous is refused, naming the host field, the other host and a rename.
Also: an empty GPU list and a GPU list `tp` does not divide are refused with file, line, field and fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetgen.config import FleetFile, Instance, load_fleet
from fleetgen.errors import ConfigError

PARTS = ["gpu", "g", "1", "0", "10", "01", "x"]
names = st.lists(st.sampled_from(PARTS), min_size=1, max_size=3).map("-".join)
gpu_lists = st.one_of(st.just("all"), st.integers(1, 4).map(lambda n: list(range(n))))


def _fleet(hosts: list[tuple[str, Any]], tp: int) -> FleetFile:
    return FleetFile.model_validate(
        {
            "engine": {"kind": "sglang", "model": "/m", "tp": tp},
            "hosts": [{"name": n, "ssh": "local", "gpus": g} for n, g in hosts],
        }
    )


def _instance_pattern(host: str) -> str:
    return re.escape(host) + r"-(0|[1-9][0-9]*)"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hosts=st.lists(st.tuples(names, gpu_lists), min_size=1, max_size=5, unique_by=lambda h: h[0]),
    tp=st.integers(1, 2),
    detected_count=st.integers(1, 3),
    data=st.data(),
)
def test_every_instance_maps_to_its_own_host_and_only_picks_exactly(
    hosts: list[tuple[str, Any]], tp: int, detected_count: int, data: st.DataObject
) -> None:
    try:
        fleet = _fleet(hosts, tp)
    except ValidationError as exc:
        for err in exc.errors():
            _, index, field = err["loc"]
            name, gpus = hosts[int(index)]
            if field == "gpus":  # refused only when tp leaves a GPU out
                assert gpus != "all" and len(gpus) % tp != 0, err
                assert "unused" in err["msg"] and "engine.tp" in err["msg"]
                continue
            assert field == "name", err
            owner = next(h for h, g in hosts if h != name and re.fullmatch(_instance_pattern(h), name))
            assert f"host {owner!r}" in err["msg"] and f"rename host {name!r}" in err["msg"]
        return
    detected = {n: list(range(detected_count * tp)) for n, g in hosts if g == "all"}
    instances = fleet.instances(detected)
    host_names = {h.name for h in fleet.hosts}
    assert len({i.name for i in instances}) == len(instances)
    assert not {i.name for i in instances} & host_names
    for inst in instances:
        assert fleet.host_of_instance(inst.name).name == inst.host
    picked_names = data.draw(
        st.lists(st.sampled_from([*host_names, *(i.name for i in instances)]), max_size=4)
    )
    selection = fleet.select(picked_names)
    got = [i for h in selection.hosts(fleet) for i in selection.pick(h.name, _of(instances, h.name))]
    want = (
        [i for i in instances if i.name in picked_names or i.host in picked_names]
        if picked_names
        else instances
    )
    assert got == want


def _of(instances: list[Instance], host: str) -> list[Instance]:
    return [i for i in instances if i.host == host]


def test_gpu_and_gpu_1_are_kept_apart(tmp_path: Path) -> None:
    fleet = _fleet([("gpu", [0]), ("gpu-1", [0, 1])], 1)
    assert [(i.name, i.host) for i in fleet.instances()] == [
        ("gpu-0", "gpu"),
        ("gpu-1-0", "gpu-1"),
        ("gpu-1-1", "gpu-1"),
    ]
    assert fleet.host_of_instance("gpu-1-0").name == "gpu-1"
    only = fleet.select(["gpu-1"])
    assert [h.name for h in only.hosts(fleet)] == ["gpu-1"]
    only_gpu = fleet.select(["gpu"])
    assert [h.name for h in only_gpu.hosts(fleet)] == ["gpu"]
    with pytest.raises(ConfigError, match="no instance named 'gpu-1'"):
        fleet.host_of_instance("gpu-1")  # a host, not an instance
    with pytest.raises(ConfigError, match="no instance or host is named 'gpu-2'"):
        fleet.select(["gpu-2"])


def _load_error(tmp_path: Path, hosts: str, tp: int = 1) -> ConfigError:
    path = tmp_path / "fleet.toml"
    path.write_text(f'[engine]\nkind = "sglang"\nmodel = "/m"\ntp = {tp}\n{hosts}')
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    return caught.value


def test_a_host_named_like_another_hosts_instance_is_refused_with_file_line_and_rename(
    tmp_path: Path,
) -> None:
    hosts = '\n[[hosts]]\nname = "gpu"\ngpus = [0, 1]\n\n[[hosts]]\nname = "gpu-1"\ngpus = [0]\n'
    err = _load_error(tmp_path, hosts)
    assert f"{tmp_path / 'fleet.toml'}:11: hosts[1].name:" in err.message
    assert "host 'gpu-1' has the name of instance 1 of host 'gpu'" in err.message
    assert "rename host 'gpu-1' (e.g. 'gpu_1')" in err.message
    all_gpus = hosts.replace("gpus = [0, 1]", 'gpus = "all"')
    assert "list host 'gpu''s GPUs" in _load_error(tmp_path, all_gpus).message


def test_empty_and_lopsided_gpu_lists_are_refused_naming_line_field_and_fix(tmp_path: Path) -> None:
    err = _load_error(tmp_path, '\n[[hosts]]\nname = "a"\ngpus = []\n')
    assert f"{tmp_path / 'fleet.toml'}:8: hosts[0].gpus: an empty GPU list starts no instance" in err.message
    err = _load_error(tmp_path, '\n[[hosts]]\nname = "a"\ngpus = [0, 1, 2]\n', tp=2)
    assert (
        "fleet.toml:8: hosts[0].gpus: gpus = [0, 1, 2] with engine.tp = 2 leaves GPU 2 unused" in err.message
    )
    assert "list a multiple of 2 GPUs (gpus = [0, 1]) or change engine.tp" in err.message
    err = _load_error(tmp_path, '\n[[hosts]]\nname = "a"\ngpus = [3]\n', tp=2)
    assert "leaves GPU 3 unused (0 instance(s)" in err.message and "list at least 2 GPUs" in err.message
