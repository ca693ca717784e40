"""`fleetgen run` off a terminal when its one instance's engine dies mid-job: the log line that says the
instance is down gives the engine's own last error (read from its log on its host through the fleet:
`fleet/status.py` `FleetView.death` over `deploy.death`), not only the requests' connection errors; the job
then waits `--wait-ready` and stops with FleetDown, every committed row kept. A real `fleetgen.sim` server on
this machine brought up by `up`; its death is the H100's real OOM traceback appended to its log, then SIGKILL
(the sim cannot run out of GPU memory)."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

from tests.fixtures.fleetcli import write_prompts
from tests.fixtures.ports import free_port
from tests.integration.tune.test_sim import die_of_oom_under_load, fleetgen_cli, sim_fleet


def test_an_engine_that_died_mid_run_is_said_in_its_own_words(tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, free_port(span=2))
    fleet.write_text(fleet.read_text().replace("gpus = [0, 1]", "gpus = [0]"))
    assert fleetgen_cli("up", "-f", str(fleet)).returncode == 0
    prompts, out = write_prompts(tmp_path / "p.jsonl", 400), tmp_path / "out"
    stop = threading.Event()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            killer = pool.submit(die_of_oom_under_load, tmp_path / "work", stop, "h-")
            args = ["--concurrency", "8", "--max-tokens", "300", "--wait-ready", "5", "--log-every", "1"]
            done = fleetgen_cli("run", str(prompts), "-o", str(out), "-f", str(fleet), *args)
            stop.set()
            assert killer.result(), done.stderr[-3000:]
        said = done.stderr
        assert done.returncode == 1, said[-3000:]
        words = (
            "it died: GPU out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 202"
        )
        assert words in said, said[-3000:]
        assert "(at chunk_delta_h.py:324 in chunk_gated_delta_rule_fwd_h)" in said
        assert "Traceback" not in said
    finally:
        stop.set()
        fleetgen_cli("down", "-f", str(fleet))
