"""`fleetgen status` of an instance whose engine died: its problem is the engine's own last error, read
from its log on its host (`fleet/status.py` `FleetView.death` over `deploy.death`), never a bare "not
running" — what `run` shows for an instance that went down and `bench` for a sweep that failed. A real
`fleetgen.sim` server on this machine (`ssh = "local"`), brought up by `up`; its death is the H100's real OOM
traceback appended to its log, then SIGKILL (the sim cannot run out of GPU memory)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.fixtures.ports import free_port
from tests.integration.tune.test_sim import OOM_LOG, fleetgen_cli, sim_fleet


def _die_of_oom(folder: Path) -> None:
    lines = OOM_LOG.read_text().splitlines(keepends=True)
    words = lines[next(i for i, x in enumerate(lines) if "Scheduler hit an exception" in x) :]
    with (folder / "logs" / "current.log").open("a") as f:
        f.writelines(words)
    pid = int((folder / "pid").read_text().strip())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def one_instance_up(tmp_path: Path) -> tuple[Path, Path]:
    """A fleet of one simulated SGLang instance, up: its fleet file and its instance folder."""
    fleet = sim_fleet(tmp_path, free_port(span=2))
    fleet.write_text(fleet.read_text().replace("gpus = [0, 1]", "gpus = [0]"))
    up = fleetgen_cli("up", "-f", str(fleet))
    assert up.returncode == 0, up.stderr[-3000:]
    [folder] = (tmp_path / "work").glob("h-*")
    return fleet, folder


def test_status_of_an_engine_that_died_says_its_last_error_where_and_the_fix(tmp_path: Path) -> None:
    fleet, folder = one_instance_up(tmp_path)
    try:
        done = fleetgen_cli("status", "-f", str(fleet), "--json")
        [alive] = json.loads(done.stdout)
        assert alive["ready"] is True, done.stdout
        _die_of_oom(folder)
        done = fleetgen_cli("status", "-f", str(fleet), "--json")
        [dead] = json.loads(done.stdout)
        assert dead["ready"] is False
        problem = dead["problem"]
        assert problem.startswith(
            "not running: it died: GPU out of memory: torch.OutOfMemoryError: CUDA out of"
        )
        assert "Tried to allocate 202.00 MiB" in problem and "1.38 MiB is free." in problem
        assert problem.endswith("(at chunk_delta_h.py:324 in chunk_gated_delta_rule_fwd_h)")
        # `down` forgets the launch: its old log's last words are no longer the instance's news
        assert fleetgen_cli("down", "-f", str(fleet)).returncode == 0
        done = fleetgen_cli("status", "-f", str(fleet), "--json")
        [stopped] = json.loads(done.stdout)
        assert (stopped["ready"], stopped["problem"]) == (False, "not running")
    finally:
        fleetgen_cli("down", "-f", str(fleet))


def test_status_of_an_engine_killed_without_an_error_in_its_log_says_not_running(tmp_path: Path) -> None:
    """No error in its log (killed from outside): nothing is made up, it is "not running"."""
    fleet, folder = one_instance_up(tmp_path)
    try:
        pid = int((folder / "pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        done = fleetgen_cli("status", "-f", str(fleet), "--json")
        [dead] = json.loads(done.stdout)
        assert (dead["ready"], dead["problem"]) == (False, "not running")
    finally:
        fleetgen_cli("down", "-f", str(fleet))
