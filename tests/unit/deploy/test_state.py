"""`deploy.state`: `.fleetgen/state.json` round trip, upsert and drop; a corrupt file is a config error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgen.deploy.state import InstanceRecord, load_state, update_state


def test_state_roundtrip_upsert_and_drop(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    rec = InstanceRecord(
        instance="h0-0",
        host="h0",
        gpus=(0,),
        port=30000,
        pid=5,
        start_time=9,
        log_path="/l",
        script_path="/s",
        script_sha256="ab",
        launched_at="t",
        argv=("a",),
        env_names=("X",),
    )
    update_state(fleet, put=[rec])
    assert load_state(fleet) == {"h0-0": rec}
    update_state(fleet, put=[InstanceRecord(**{**rec.__dict__, "instance": "h0-1"})], drop=["h0-0"])
    assert list(load_state(fleet)) == ["h0-1"]
    assert (tmp_path / ".fleetgen" / "state.json").exists()


@pytest.mark.parametrize(
    "bad",
    [
        "{",
        "[]",
        '{"instances": {"h0-0": {"instance": "h0-0", "host": "h0"}}}',  # a record without its pid, port…
        '{"instances": {"h0-0": "not a record"}}',
        '{"instances": {"h0-0": {"instance": "h0-0", "host": "h0", "gpus": "0", "port": 1, "pid": 1, '
        '"start_time": 1, "log_path": "", "script_path": "", "script_sha256": "", "launched_at": ""}}}',
    ],
)
def test_corrupt_state_is_a_config_error(tmp_path: Path, bad: str) -> None:
    from fleetgen.errors import ConfigError

    (tmp_path / ".fleetgen").mkdir()
    (tmp_path / ".fleetgen" / "state.json").write_text(bad)
    with pytest.raises(ConfigError, match="state"):
        load_state(tmp_path / "fleet.toml")


def test_a_state_file_written_before_placements_loads_its_slurm_job_as_the_placement_id(
    tmp_path: Path,
) -> None:
    """Schema 1 (the code before the placement seam) wrote a Slurm record's job as `slurm_job`, and an SSH
    host's as "": both load, the job as `placement_id`, and the next write is schema 2 without the old key."""
    fleet = tmp_path / "fleet.toml"
    common = {"gpus": [0], "port": 30000, "pid": 0, "start_time": 0, "log_path": "/l", "script_path": "/s"}
    common |= {"script_sha256": "ab", "launched_at": "t", "argv": ["python"], "env_names": []}
    old = {
        "schema": 1,
        "fleet_file": str(fleet),
        "instances": {
            "slurm-0": {**common, "instance": "slurm-0", "host": "slurm", "slurm_job": "4242", "node": "n1"},
            "h0-0": {**common, "instance": "h0-0", "host": "h0", "slurm_job": "", "node": ""},
        },
    }
    (tmp_path / ".fleetgen").mkdir()
    (tmp_path / ".fleetgen" / "state.json").write_text(json.dumps(old))
    records = load_state(fleet)
    assert records["slurm-0"].placement_id == "4242" and records["slurm-0"].node == "n1"
    assert records["h0-0"].placement_id == ""
    update_state(fleet, drop=["h0-0"])
    written = json.loads((tmp_path / ".fleetgen" / "state.json").read_text())
    assert written["schema"] == 2 and "slurm_job" not in written["instances"]["slurm-0"]
    assert load_state(fleet) == {"slurm-0": records["slurm-0"]}
