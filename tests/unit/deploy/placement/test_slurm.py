"""`deploy.placement.slurm`'s sbatch argv: one server's job, no secret anywhere in it, the user's options
after fleetgen's (never instead of them), Slurm left to pick the GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.config import load_fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.placement.slurm import JOB_SH, job_name, sbatch_argv
from fleetgen.deploy.wanted import build_wanted
from fleetgen.engines import get_engine
from fleetgen.remote.slurm import EXPORT

FLEET = """\
[engine]
kind = "sglang"
model = "/models/m"
tp = {tp}
bind = "0.0.0.0"
api_key_env = "FLEETGEN_UNIT_KEY"

[cluster]
kind = "slurm"
partition = "gpu"
gpus = 8
time = "3-00:00:00"
account = "proj"
sbatch_args = ["--qos=high", "--constraint=h200"]
"""
KEY = "unit-test-key-0123456789abcdef"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_sbatch_argv_one_server_per_job_no_secret_user_args_last(tmp_path: Path, tp: int) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(tp=tp))
    fleet = load_fleet(path)
    survey = HostSurvey(workdir="/shared/fleetgen", has_nvidia_smi=False, uptime_s=0.0, clk_tck=100)
    for inst in fleet.instances():
        wanted = build_wanted(fleet, get_engine("sglang"), inst, survey, KEY)
        name = job_name(path, inst.name)
        argv = sbatch_argv(fleet.cluster, wanted, name, ["/shared/job.sh", "a", "b"])  # type: ignore[arg-type]
        text = "\n".join([*argv, wanted.script, JOB_SH])
        assert KEY not in text  # not in sbatch's argv, the launch script or the batch script
        assert f"--gres=gpu:{tp}" in argv and "--nodes=1" in argv and f"--job-name={name}" in argv
        assert EXPORT in argv and "ALL" not in EXPORT  # fleetgen's own environment (the key) is not exported
        assert argv[-5:] == ["--qos=high", "--constraint=h200", "/shared/job.sh", "a", "b"]
        assert "--partition=gpu" in argv and "--time=3-00:00:00" in argv and "--account=proj" in argv
        assert "CUDA_VISIBLE_DEVICES" not in wanted.script  # Slurm picks the job's GPUs
    names = {job_name(path, i.name) for i in fleet.instances()}
    assert len(names) == 8 // tp  # one job name per server
    other = tmp_path / "other" / "fleet.toml"
    assert job_name(other, "slurm-0") != job_name(path, "slurm-0")  # and per fleet file
