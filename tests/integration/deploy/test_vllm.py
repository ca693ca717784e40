"""`up → ready → verified (planned = actual capacity) → request → status → restart with a changed flag → up
again → down` on a REAL vLLM-CPU server (tiny local model) deployed over a REAL sshd host."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.deploy.readiness import Readiness
from fleetgen.deploy.types import Action
from fleetgen.fleet.pool import ready_endpoints
from fleetgen.fleet.status import fleet_status
from tests.fixtures.sshd import SshdHost
from tests.fixtures.vllm import TinyModel
from tests.integration.deploy.support import log_files, read, resolved, write_fleet
from tests.unit.fleet.test_status import STATUS_JSON_KEYS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'


def _fleet(path: Path, host: SshdHost, python: Path, model: TinyModel, cache: Path, max_len: int) -> Path:
    return write_fleet(
        path,
        [host],
        kind="vllm",
        python=str(python),
        model=str(model.path),
        workdir_tag=path.parent.name,
        served_model_name="tiny",
        ready_timeout_s=600.0,
        args={
            "enforce-eager": True,
            "dtype": "bfloat16",
            "max-model-len": max_len,
            "speculative-config": NGRAM,
        },
        env={
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "HF_HOME": str(cache / "hf"),
            "PYTHONUNBUFFERED": "1",
        },
    )


async def test_vllm_lifecycle(
    ssh_hosts: list[SshdHost], vllm_python: Path, tiny_model: TinyModel, tmp_path: Path
) -> None:
    host = ssh_hosts[0]
    fleet = _fleet(tmp_path / "fleet.toml", host, vllm_python, tiny_model, tmp_path, 2048)
    workdir = host.workdir / tmp_path.name
    try:
        [first] = await up(Fleet.load(fleet))
        assert first.error is None, str(first.error)
        assert first.action is Action.STARTED and first.error is None and first.verified is not None
        assert first.verified.model == "tiny"
        assert first.verified.accept_length is not None and first.verified.accept_length >= 1.0
        # The plan of vLLM's CPU build (VLLM_CPU_KVCACHE_SPACE) is what the engine reports, figure by figure.
        capacity = {r.what: (r.planned, r.actual) for r in first.verified.capacity}
        assert capacity.keys() == {"kv_tokens", "max_running_requests"}, capacity
        assert all(planned == actual and (actual or 0) > 0 for planned, actual in capacity.values()), capacity

        async with ready_endpoints(Fleet.load(fleet)) as [ep]:
            # no max-num-seqs: its concurrency at max-model-len is a floor it runs past (`run` fills it)
            assert ep.max_running_requests and ep.running_is_floor
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    ep.url + "/v1/chat/completions",
                    json={
                        "model": "tiny",
                        "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 8,
                        "ignore_eos": True,
                    },
                ) as resp,
            ):
                body = await resp.json()
            assert resp.status == 200 and body["usage"]["completion_tokens"] == 8

        [st] = await fleet_status(Fleet.load(fleet))
        assert st.readiness is Readiness.READY and st.drift == [] and st.pid == first.pid and st.running == 0
        assert st.uptime_s is not None and st.uptime_s > 0 and st.gen_tokens_per_s is not None
        assert set(st.to_json()) >= STATUS_JSON_KEYS

        old_log = Path(first.log_path)
        _fleet(fleet, host, vllm_python, tiny_model, tmp_path, 1024)
        [second] = await up(Fleet.load(fleet))
        assert second.error is None, str(second.error)
        assert second.action is Action.REPLACED and second.pid != first.pid
        assert Path(second.log_path) != old_log and re.search(r"max_model_len\W{1,4}2048", read(old_log))
        assert re.search(r"max_model_len\W{1,4}1024", read(Path(second.log_path)))
        assert resolved(workdir / "h0-0" / "logs" / "current.log") == resolved(Path(second.log_path))
        assert "--max-model-len 1024" in read(workdir / "h0-0" / "launch.sh")

        logs_before = log_files(workdir, "h0-0")
        [third] = await up(Fleet.load(fleet))
        assert third.error is None, str(third.error)
        assert third.action is Action.UNCHANGED and third.pid == second.pid
        assert log_files(workdir, "h0-0") == logs_before
    finally:
        [stopped] = await down(Fleet.load(fleet))
    assert stopped.error is None and stopped.action is Action.STOPPED
    [after] = await fleet_status(Fleet.load(fleet), rate_window_s=0)
    assert after.readiness is Readiness.DOWN and after.pid is None and after.problem == "not running"
