"""`up`'s checks before it starts anything are never skipped in silence, and `--only` scopes them.

Over REAL sshd, with `fleetgen.sim` as the engine:
- the model folder exists only on the host side (`~/…`: the host's home, which `up` never expands here), with
  flags the engine's own rule refuses: `up` reads config.json over its connection and refuses before starting
  anything (it used to skip the rules without a word when config.json was not readable here);
- a model folder without config.json anywhere: `up` goes on, saying which checks it skipped, why, and the fix;
- `--only`: a clash among instances it did not pick stops none it picked; one touching a picked one stops it.
"""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from fleetgen.config import load_fleet
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.errors import PlanError
from tests.fixtures.fleetcli import cli
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.support import log_files
from tests.integration.deploy.test_sglang import QWEN36, sim_fleet

# Folder names a user may well have: spaces, quotes, a `$`, non-ASCII; each must reach the host as one path.
UGLY = ["plain", "with space 'quote' $HOME ü"]


def _refused_on_port(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


@pytest.mark.parametrize("name", UGLY)
async def test_up_reads_the_model_on_the_host_and_refuses_what_the_engine_refuses(
    ssh_hosts: list[SshdHost], tmp_path: Path, name: str
) -> None:
    """no_buffer with the overlap scheduler: the engine's own rule (the sim's 0.5.23) refuses it at start."""
    home_dir = Path.home() / f".fleetgen-test-{tmp_path.name}"
    shutil.copytree(QWEN36, home_dir / name / "model")
    model = f"~/{home_dir.name}/{name}/model"
    assert not (Path(model) / "config.json").exists()  # the plan side cannot read it here
    args = {"mamba-radix-cache-strategy": "no_buffer"}
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], model=Path(model), args=args)
    assert load_fleet(fleet).engine.model == model
    port = load_fleet(fleet).instances()[0].port
    root = ssh_hosts[0].workdir / tmp_path.name / "h0-0"
    try:
        with pytest.raises(PlanError) as refused:
            await up(Fleet.load(fleet))
        assert "[no-buffer-overlap] h0-0:" in refused.value.message and "--no-plan-check" in refused.value.fix
        assert not (root / "pid").exists() and not log_files(root.parent, "h0-0")
        assert _refused_on_port(port)
    finally:
        await down(Fleet.load(fleet))
        shutil.rmtree(home_dir)


async def test_plan_and_up_read_the_model_on_the_host_not_a_folder_here_of_the_same_name(
    ssh_hosts: list[SshdHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`engine.model` is a folder on the host (the hybrid Qwen3.6); a folder here by the same relative name
    holds another, dense model. `plan` and `up` both size and check the host's model: its Mamba rule refuses
    no_buffer with the overlap scheduler in both, before anything starts (`up` read the decoy here, saw a
    dense model, checked nothing and launched)."""
    home_dir = Path.home() / f".fleetgen-test-{tmp_path.name}"
    shutil.copytree(QWEN36, home_dir / "model")
    model = f"~/{home_dir.name}/model"
    monkeypatch.chdir(tmp_path)
    shutil.copytree(QWEN36.parent / "llama-3.1-8b", tmp_path / model)  # "./~/…": same name, here
    fleet = sim_fleet(
        tmp_path, ssh_hosts[:1], model=Path(model), args={"mamba-radix-cache-strategy": "no_buffer"}
    )
    _, planned, _ = await cli("plan", "--json", "-f", str(fleet))
    [plan] = json.loads(planned)["instances"]
    assert "no-buffer-overlap" in [e["rule"] for e in plan["errors"]], plan["errors"]
    root = ssh_hosts[0].workdir / tmp_path.name / "h0-0"
    try:
        with pytest.raises(PlanError) as refused:
            await up(Fleet.load(fleet))
        assert "[no-buffer-overlap] h0-0:" in refused.value.message
        assert not (root / "pid").exists()
    finally:
        await down(Fleet.load(fleet))
        shutil.rmtree(home_dir)


async def test_up_says_which_checks_it_skipped_when_no_config_json_is_readable(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    """An empty model folder (config.json neither here nor on the host): `up` starts it, and says so first."""
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])
    said: list[tuple[str, str]] = []
    try:
        [out] = await up(Fleet.load(fleet), progress=lambda inst, msg: said.append((inst, msg)))
        assert out.error is None, out.error
        [warning] = [m for who, m in said if who == str(fleet) and m.startswith("warning:")]
        assert "engine's own rules for each instance's flags" in warning
        assert f"cannot read {tmp_path / 'model' / 'config.json'} on h0" in warning
        assert 'engine.model_config = "<local folder with config.json>"' in warning
        assert said.index((str(fleet), warning)) < next(i for i, (w, _) in enumerate(said) if w == "h0-0")
    finally:
        await down(Fleet.load(fleet))


async def test_only_scopes_the_fleet_wide_check(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    """Hosts `h1` and `h1b` are one machine (one sshd) whose instances both claim GPU 0 and one port: `up
    --only` anything else starts; `--only` either of them (by host or by instance) is refused."""
    twin = replace(ssh_hosts[1], name="h1b")
    fleet = sim_fleet(tmp_path, [ssh_hosts[0], ssh_hosts[1], twin], model=QWEN36)
    ports = [i.port for i in load_fleet(fleet).instances()]
    fleet.write_text(fleet.read_text().replace(f"base_port = {ports[2]}", f"base_port = {ports[1]}"))
    assert [i.port for i in load_fleet(fleet).instances()] == [ports[0], ports[1], ports[1]]
    try:
        for only in (["h1b"], ["h1-0"], ["h0", "h1b-0"]):
            with pytest.raises(PlanError) as refused:
                await up(Fleet.load(fleet), only=only)
            assert "[port-clash] h1b-0 and h1-0" in refused.value.message
        assert _refused_on_port(ports[0])
        [out] = await up(Fleet.load(fleet), only=["h0-0"])
        assert out.error is None, out.error
    finally:
        await down(Fleet.load(fleet))
