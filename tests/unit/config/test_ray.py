"""`[cluster] kind = "ray"` in the fleet file: it loads into `<name>-<k>` instances on `gpus / tp` slots, or
is refused at file:line naming the field and the fix (Ray's own resources, a runtime env's variables, an
address Ray cannot take, GPUs `tp` does not divide)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.config import RayCluster, load_fleet
from fleetgen.errors import ConfigError

ENGINE = '[engine]\nkind = "sglang"\nmodel = "/models/m"\ntp = {tp}\n'


def write(tmp_path: Path, extra: str = "", *, tp: int = 1, gpus: int = 4) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(ENGINE.format(tp=tp) + f'\n[cluster]\nkind = "ray"\ngpus = {gpus}\n{extra}\n')
    return path


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    return caught.value.message


def line_of(path: Path, needle: str) -> int:
    return next(i + 1 for i, row in enumerate(path.read_text().splitlines()) if needle in row)


@pytest.mark.parametrize(("tp", "gpus"), [(1, 1), (1, 4), (2, 8), (4, 4), (8, 64)])
def test_servers_are_gpus_over_tp_on_the_driver_standing_as_one_host(
    tmp_path: Path, tp: int, gpus: int
) -> None:
    fleet = load_fleet(write(tmp_path, "base_port = 31000", tp=tp, gpus=gpus))
    assert isinstance(fleet.cluster, RayCluster) and fleet.cluster.address == "auto"
    assert [i.name for i in fleet.instances()] == [f"ray-{k}" for k in range(gpus // tp)]
    assert [i.port for i in fleet.instances()] == [31000 + k for k in range(gpus // tp)]
    assert [h.name for h in fleet.hosts] == ["ray"] and fleet.hosts[0].is_local  # this machine: the driver
    assert fleet.placement_kind == "ray" and fleet.assigns_devices


@pytest.mark.parametrize(
    "address", ["auto", "ray://head:10001", "ray://10.0.0.1", "head:6379", "10.0.0.1:6379"]
)
def test_every_address_form_ray_takes_loads(tmp_path: Path, address: str) -> None:
    assert load_fleet(write(tmp_path, f'address = "{address}"')).cluster is not None


@pytest.mark.parametrize(
    ("extra", "key", "says"),
    [
        ('address = "http://head:8265"', "address", "should match pattern"),
        ('address = "head"', "address", "should match pattern"),
        ("resources = { GPU = 1 }", "resources", "set by fleetgen or Ray"),
        ('resources = { "node:10.0.0.1" = 1 }', "resources", "set by fleetgen or Ray"),
        ("resources = { ssd = 0 }", "resources", "greater than 0"),
        ('runtime_env = { env_vars = { HF_TOKEN = "x" } }', "runtime_env", "readable by every job"),
        ('namespace = "two words"', "namespace", "should match pattern"),
        ('partition = "gpu"', "partition", "Extra inputs"),
    ],
)
def test_a_bad_ray_key_is_refused_at_its_line(tmp_path: Path, extra: str, key: str, says: str) -> None:
    path = write(tmp_path, extra)
    message = refused(path)
    assert f"{path}:{line_of(path, f'{key} =')}: cluster.{key}" in message and says in message, message


def test_gpus_tp_does_not_divide_are_refused_with_the_counts_that_work(tmp_path: Path) -> None:
    path = write(tmp_path, tp=4, gpus=6)
    message = refused(path)
    assert f"{path}:{line_of(path, 'gpus =')}: cluster.gpus" in message and "set gpus = 4 or 8" in message
