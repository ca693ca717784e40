"""The dashboard's planned capacity reads the model's shape as `plan` and `up` do (`modelshape.model_shape`):
`engine.model_config` here, else `engine.model` on the fleet's first host reached, never a folder here that
merely has the model's name. The host is this machine (`LocalHost`: real subprocesses, nothing faked).
Its rows from bare `--endpoint` URLs are judged by health alone, the engine's own state a remark beside."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp

from fleetgen.dashboard.fleetdata import EndpointSource, planned_max_running_requests
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.readiness import Readiness
from fleetgen.http.urls import BareURLs
from fleetgen.remote.local import LocalHost
from tests.fixtures.standin import StandIn, serve

QWEN = Path(__file__).parents[2] / "data" / "models" / "qwen3.6-27b"


def _fleet(tmp_path: Path, model: str, model_config: Path | None = None) -> Fleet:
    lines = ["[engine]", 'kind = "sglang"', 'version = "0.5.15"', f'model = "{model}"']
    lines += [f'model_config = "{model_config}"'] if model_config else []
    lines += ["[[hosts]]", 'name = "n"', "gpus = [0, 1]", "gpu_memory_gib = 141"]
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Fleet.load(path)


async def test_a_same_named_folder_here_is_never_read(tmp_path: Path) -> None:
    shutil.copytree(QWEN, tmp_path / "models" / "qwen")  # beside the fleet file, as engine.model names it
    planned, note = await planned_max_running_requests(_fleet(tmp_path, "./models/qwen"), None)
    assert planned == {} and "none was reached" in note and "model_config" in note
    planned, note = await planned_max_running_requests(_fleet(tmp_path, "./models/qwen"), LocalHost("n"))
    assert planned == {} and "cannot read ./models/qwen/config.json on n" in note  # on the host: not there


async def test_the_model_is_read_on_the_host_or_from_model_config(tmp_path: Path) -> None:
    on_host, note = await planned_max_running_requests(_fleet(tmp_path, str(QWEN)), LocalHost("n"))
    assert note == "" and sorted(on_host) == ["n-0", "n-1"] and all(n > 0 for n in on_host.values())
    here, note = await planned_max_running_requests(_fleet(tmp_path, "/not/here", QWEN), None)
    assert (here, note) == (on_host, "")


async def test_a_bare_url_row_is_ready_by_its_health_and_says_what_its_engine_did_not_answer() -> None:
    """An SGLang whose /server_info does not answer (the stand-in serves none) is still READY, as `run
    --endpoint` takes it, and the row says why its max running is unknown (the row dropped that); a URL where
    nothing listens is DOWN, naming the URL asked."""
    sglang = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n"
    async with serve(StandIn(metrics_text=sglang)) as up, aiohttp.ClientSession() as http:
        nowhere = "http://127.0.0.1:9"
        live, dead = await EndpointSource(BareURLs((up.url, nowhere)), http)()
    assert live.readiness is Readiness.READY and live.running == 3 and live.max_running_requests is None
    assert "info endpoint did not answer" in live.problem
    assert dead.readiness is Readiness.DOWN and f"GET {nowhere}/health" in dead.problem
