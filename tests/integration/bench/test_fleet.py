"""`fleetgen bench -f FLEET` when an instance's engine dies mid-sweep (`bench/fleet.py`): the error is
the engine's own last error, read from its log on its host (`fleet.status.engine_deaths` over
`deploy.death`), with where it was raised and the fix; never only the requests' transport errors. A real
`fleetgen.sim` server on this machine brought up by `up`; its death is the H100's real OOM traceback appended
to its log, then SIGKILL (the sim cannot run out of GPU memory)."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

from tests.fixtures.ports import free_port
from tests.integration.tune.test_sim import die_of_oom_under_load, fleetgen_cli, sim_fleet


def test_a_sweep_whose_engine_died_says_the_engines_last_error_and_the_fix(tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, free_port(span=2))
    fleet.write_text(fleet.read_text().replace("gpus = [0, 1]", "gpus = [0]"))
    assert fleetgen_cli("up", "-f", str(fleet)).returncode == 0
    stop = threading.Event()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            killer = pool.submit(die_of_oom_under_load, tmp_path / "work", stop, "h-")
            knobs = ["--concurrency", "4,8,16", "--output-len", "400", "--input-len", "32", "--rounds", "2"]
            done = fleetgen_cli("bench", "-f", str(fleet), *knobs)
            stop.set()
            assert killer.result(), done.stderr[-3000:]
        assert done.returncode != 0
        said = " ".join(done.stderr.split())  # the CLI wraps long lines
        assert "the engine died during the sweep: h-0: GPU out of memory: torch.OutOfMemoryError" in said, (
            said
        )
        assert "Tried to allocate 202.00 MiB" in said and "chunk_gated_delta_rule_fwd_h" in said
        assert "fix: lower mem-fraction-static" in said
    finally:
        stop.set()
        fleetgen_cli("down", "-f", str(fleet))
