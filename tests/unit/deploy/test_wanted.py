"""`wanted_command` (what `status` compares and `down` stops) is the command `build_wanted` launches, with no
script rendered: a host's `engine_args` included."""

from __future__ import annotations

from pathlib import Path

from fleetgen.config import load_fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.wanted import build_wanted, wanted_command
from fleetgen.engines import get_engine

FLEET = """\
[engine]
kind = "sglang"
model = "/models/m"
tp = 1

[engine.args]
max-running-requests = 8

[[hosts]]
name = "a"
gpus = [0, 1]

[[hosts]]
name = "b"
gpus = [0]
engine_args = {"max-running-requests" = 16, "chunked-prefill-size" = 4096}
"""


def test_wanted_command_is_the_launched_command_host_engine_args_included(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    fleet, engine = load_fleet(path), get_engine("sglang")
    survey = HostSurvey(workdir="/w", has_nvidia_smi=False, uptime_s=0.0, clk_tck=100)
    for inst in fleet.instances():
        assert (
            wanted_command(fleet, engine, inst, survey)
            == build_wanted(fleet, engine, inst, survey, None).command
        )
    [on_b] = [i for i in fleet.instances() if i.host == "b"]
    assert "16" in wanted_command(fleet, engine, on_b, survey).args  # b's own value, not [engine.args]'
