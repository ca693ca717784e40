"""What a Slurm or Ray user reads before writing `[cluster]`: the README's key table of each kind names every
key its model has, each with its default, and `fleetgen init`'s commented `[cluster]` example, uncommented in
place of the `[[hosts]]` entries, is a cluster fleet file that loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

import fleetgen.cli.init  # noqa: F401  (registers `init` on the app)
from fleetgen.cli.app import app
from fleetgen.config import RayCluster, SlurmCluster, load_fleet

README = Path(__file__).resolve().parents[3] / "README.md"
ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \|")


TABLES: dict[str, tuple[type[BaseModel], str]] = {
    "slurm": (SlurmCluster, "| `[cluster]` key |"),
    "ray": (RayCluster, '| `[cluster] kind = "ray"` key |'),
}


def readme_keys(header: str) -> dict[str, str]:
    """Key → default column of the README's key table under `header`."""
    text = README.read_text()
    table = text[text.index(header) :].split("\n\n", 1)[0]
    return {m.group(1): m.group(2).strip() for line in table.splitlines()[2:] if (m := ROW.match(line))}


def documented_default(value: object) -> str:
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_the_readme_table_lists_every_cluster_key_with_its_default(kind: str) -> None:
    model, header = TABLES[kind]
    rows = readme_keys(header)
    assert set(rows) == set(model.model_fields)
    for name, field in model.model_fields.items():
        if field.default is PydanticUndefined and field.default_factory is None:
            assert rows[name] == "required", name
        elif field.default is None:
            assert rows[name] != "required", name  # optional: the table says what stands in
        else:
            default = field.default if field.default_factory is None else field.default_factory()  # type: ignore[call-arg]
            assert rows[name] == documented_default(default), name


def test_inits_cluster_example_uncommented_instead_of_the_hosts_loads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    assert CliRunner().invoke(app, ["init", str(path)]).exit_code == 0
    head, _, tail = path.read_text().partition("\n# [cluster]\n")
    assert tail, "init writes a commented [cluster] table"
    without_hosts = re.sub(r"\[\[hosts\]\]\n(?:[^\n]+\n)*", "", head)
    cluster = "\n".join(line.removeprefix("# ") for line in tail.splitlines() if line.startswith("# "))
    path.write_text(f"{without_hosts}\n[cluster]\n{cluster}\n")
    fleet = load_fleet(path)
    assert (
        isinstance(fleet.cluster, SlurmCluster)
        and fleet.cluster.partition == "gpu"
        and fleet.cluster.gpus == 16
    )
    written = set(re.findall(r"^(\w+) =", cluster, re.MULTILINE))
    assert written <= set(SlurmCluster.model_fields) and len(written) >= 12  # a key of each kind shown
