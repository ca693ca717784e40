"""`deploy.state`: `.fleetgen/state.json` round trip, upsert and drop; a corrupt file is a config error."""

from __future__ import annotations

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
