"""`[cluster]` (Slurm placement) in the fleet file: strict, exactly one placement, errors at file:line: field.

The invariant: a cluster fleet file either loads into instances `<name>-<k>` (k < gpus / tp, ports base+k,
the submit host standing as its one `[[hosts]]` entry) or is refused naming the line and field to fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.config import SlurmCluster, load_fleet
from fleetgen.errors import ConfigError

ENGINE = """\
[engine]
kind = "sglang"
model = "/models/m"
tp = {tp}
"""
CLUSTER = """
[cluster]
kind = "slurm"
partition = "gpu"
gpus = {gpus}
time = "{time}"
{extra}
"""


def write(tmp_path: Path, *, tp: int = 1, gpus: int = 4, time: str = "3-00:00:00", extra: str = "") -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(ENGINE.format(tp=tp) + CLUSTER.format(gpus=gpus, time=time, extra=extra))
    return path


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    return caught.value.message


def line_of(path: Path, needle: str) -> int:
    return next(i + 1 for i, row in enumerate(path.read_text().splitlines()) if needle in row)


@pytest.mark.parametrize(("tp", "gpus"), [(1, 1), (1, 4), (2, 16), (4, 8), (8, 8), (3, 12)])
def test_servers_are_gpus_over_tp_each_on_its_own_port(tmp_path: Path, tp: int, gpus: int) -> None:
    fleet = load_fleet(write(tmp_path, tp=tp, gpus=gpus, extra="base_port = 31000"))
    instances = fleet.instances()
    assert [i.name for i in instances] == [f"slurm-{k}" for k in range(gpus // tp)]
    assert [i.port for i in instances] == [31000 + k for k in range(gpus // tp)]
    assert all(len(i.gpus) == tp for i in instances) and fleet.cluster is not None
    assert [h.name for h in fleet.hosts] == ["slurm"] and fleet.hosts[0].is_local  # the submit host


@pytest.mark.parametrize("time", ["90", "30:00", "12:00:00", "3-00:00:00", "2-12", "1-0:30", "UNLIMITED"])
def test_every_slurm_time_form_loads(tmp_path: Path, time: str) -> None:
    assert load_fleet(write(tmp_path, time=time)).cluster is not None


@pytest.mark.parametrize("time", ["3 days", "", "1:2:3:4", "-1", "3d", "12h"])
def test_a_time_slurm_cannot_read_names_its_line(tmp_path: Path, time: str) -> None:
    path = write(tmp_path, time=time)
    assert f"{path}:{line_of(path, 'time =')}: cluster.time" in refused(path)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ('["-p", "other"]', "partition"),
        ('["--partition=other"]', "partition"),
        ('["--time=10"]', "time"),
        ('["-A", "x"]', "account"),
        ('["--gres=gpu:2"]', ""),
        ('["--job-name=x"]', ""),
        ('["--output=/tmp/o"]', ""),
    ],
)
def test_sbatch_args_cannot_contradict_what_fleetgen_sets(tmp_path: Path, args: str, field: str) -> None:
    path = write(tmp_path, extra=f"sbatch_args = {args}")
    message = refused(path)
    assert f"{path}:{line_of(path, 'sbatch_args')}: cluster.sbatch_args" in message
    assert (f"set cluster.{field} instead" if field else "fleetgen sets it") in message


def test_other_sbatch_args_pass_through(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, extra='sbatch_args = ["--qos=high", "--constraint=h200"]'))
    assert isinstance(fleet.cluster, SlurmCluster) and fleet.cluster.sbatch_args == [
        "--qos=high",
        "--constraint=h200",
    ]


@pytest.mark.parametrize(("tp", "gpus"), [(2, 7), (4, 6), (8, 4), (3, 8)])
def test_gpus_tp_does_not_divide_is_refused_with_a_count_that_works(
    tmp_path: Path, tp: int, gpus: int
) -> None:
    path = write(tmp_path, tp=tp, gpus=gpus)
    message = refused(path)
    assert f"{path}:{line_of(path, 'gpus =')}: cluster.gpus" in message and f"engine.tp = {tp}" in message


def test_a_server_wider_than_a_node_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, tp=8, gpus=16, extra="gpus_per_node = 4")
    assert f"{path}:{line_of(path, 'gpus_per_node')}: cluster.gpus_per_node" in refused(path)


def test_a_typo_in_cluster_is_an_error_not_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, extra='acount = "x"')
    assert f"{path}:{line_of(path, 'acount')}: cluster.acount" in refused(path)


def test_exactly_one_placement(tmp_path: Path) -> None:
    both = write(tmp_path, extra='\n[[hosts]]\nname = "a"\ngpus = [0]')
    assert "both [[hosts]] and [cluster]" in refused(both)
    neither = tmp_path / "neither.toml"
    neither.write_text(ENGINE.format(tp=1))
    assert "no [[hosts]] and no [cluster]" in refused(neither)


def test_ssh_hosts_stay_the_default_placement(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(ENGINE.format(tp=1) + '\n[[hosts]]\nname = "a"\ngpus = [0, 1]\n')
    fleet = load_fleet(path)
    assert fleet.cluster is None and [i.name for i in fleet.instances()] == ["a-0", "a-1"]


@pytest.mark.parametrize("kind_line", ["", 'kind = "k8s"', 'kind = "Slurm"'])
def test_a_cluster_without_a_kind_fleetgen_places_is_refused_naming_the_kinds(
    tmp_path: Path, kind_line: str
) -> None:
    """No default kind: a `[cluster]` without `kind` (or with one no placement has) is refused at its table's
    line, naming every kind (a default would read a Ray table's typo as Slurm's)."""
    path = write(tmp_path)
    path.write_text(path.read_text().replace('kind = "slurm"', kind_line))
    message = refused(path)
    assert f"{path}:{line_of(path, '[cluster]')}: cluster: " in message
    assert "kind = 'slurm' or 'ray'" in message


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("slurm", "namespace", '"x"'),
        ("slurm", "address", '"auto"'),
        ("ray", "wat", "1"),
        ("ray", "extra", "1"),
    ],
)
def test_a_key_of_another_kind_is_refused_at_its_line_by_its_own_name(
    tmp_path: Path, kind: str, key: str, value: str
) -> None:
    """The union's tag never shows in the field a user reads: `cluster.namespace`, not
    `cluster.slurm.namespace`."""
    path = tmp_path / "fleet.toml"
    table = 'partition = "gpu"\ntime = "10"' if kind == "slurm" else 'address = "auto"'
    path.write_text(
        ENGINE.format(tp=1) + f'\n[cluster]\nkind = "{kind}"\ngpus = 4\n{table}\n{key} = {value}\n'
    )
    assert f"{path}:{line_of(path, f'{key} =')}: cluster.{key}: Extra inputs" in refused(path)
