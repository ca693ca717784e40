"""The CLI's one error renderer: message, context and fix, printed verbatim (no markup from user text)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fleetgen.cli.deploy as deploy_cli
from fleetgen.cli import _TOPICS
from fleetgen.cli.app import app
from fleetgen.deploy.readiness import Readiness
from fleetgen.fleet.status import InstanceStatus
from fleetgen.generate.ledger.store import Store


def _cli() -> CliRunner:
    """A runner over the app with every topic registered, as `main()` does before running it."""
    for topic in _TOPICS:
        importlib.import_module(f"fleetgen.cli.{topic}")
    return CliRunner()


def test_a_config_error_names_file_line_field_and_fix_with_brackets_intact(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[engine]\nkind = "sglang"\nmodel = "/m"\n\n[[hosts]]\nname = "a"\ngpus = [0, 0]\n')
    result = _cli().invoke(app, ["plan", "-f", str(fleet), "--offline"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"{fleet}:7: hosts[0].gpus: GPU indices repeat in [0, 0]" in text
    assert "fix: edit" in text


def test_plan_refuses_an_empty_gpu_list_instead_of_zero_instances_that_all_fit(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[engine]\nkind = "sglang"\nmodel = "/m"\n\n[[hosts]]\nname = "a"\ngpus = []\n')
    result = _cli().invoke(app, ["plan", "-f", str(fleet), "--offline"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "all instances fit" not in text
    assert f"{fleet}:7: hosts[0].gpus: an empty GPU list starts no instance on this host" in text


def test_init_names_the_tables_to_edit(tmp_path: Path) -> None:
    result = _cli().invoke(app, ["init", str(tmp_path / "f.toml")])
    assert result.exit_code == 0
    assert "edit [[hosts]] and [engine]" in " ".join(result.output.split())


def test_plan_shows_one_table_per_group_of_identical_instances() -> None:
    example = Path(__file__).parents[3] / "examples" / "qwen36-27b-mtp.toml"
    result = _cli().invoke(app, ["plan", "--offline", "-f", str(example)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "node96-0 … node96-3: 4 identical instances" in text
    assert "node183-0 … node183-6: 7 identical instances" in text
    assert "11 instance(s)" in text and "all instances fit" in text


def test_status_prints_a_problem_with_brackets_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host key pattern on another port (`[host]:2222`) is text, not a rich tag to swallow."""
    problem = "the host key of a ([gpu1.example.com]:2222) CHANGED: see [[hosts]] a"

    async def fake_status(fleet: object, only: object = None, probe: bool = False) -> list[InstanceStatus]:
        assert probe  # `status` sends each healthy instance a probe request
        return [InstanceStatus("a-0", "a", (0,), 30000, readiness=Readiness.DOWN, problem=problem)]

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[engine]\nkind = "sglang"\nmodel = "/m"\n\n[[hosts]]\nname = "a"\nssh = "local"\ngpus = [0]\n'
    )
    runner = _cli()
    monkeypatch.setattr(deploy_cli, "fleet_status", fake_status)
    result = runner.invoke(app, ["status", "-f", str(fleet)], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    assert problem in result.output, result.output


def test_report_prints_a_path_with_brackets_verbatim(tmp_path: Path) -> None:
    """A folder named like `job[v2]` is a path, not a rich tag: `report` names the file it wrote."""
    out = tmp_path / "job[v2]"
    Store.open(out).close()
    result = _cli().invoke(app, ["report", str(out)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'report.html'} — 0 done" in result.output


def test_export_of_no_row_is_an_error(tmp_path: Path) -> None:
    """An empty training file is nothing useful: `export` says so and exits 1."""
    Store.open(tmp_path).close()
    result = _cli().invoke(app, ["export", str(tmp_path)])
    assert result.exit_code == 1
    assert "error: no row was written (see the reasons above)" in result.output


def test_bench_refuses_a_scope_it_does_not_sweep_naming_the_three() -> None:
    result = _cli().invoke(app, ["bench", "--endpoint", "http://127.0.0.1:9", "--scope", "fleets"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "--scope is one of: instances, fleet, both" in text
