"""`fleetgen.sim` against real SGLang: everything fleetgen reads behaves alike in the simulation and in the
captures of SGLang 0.5.15 with MTP on an H200 (tests/data/real-engines/sglang-0.5.15-h200/mtp).

The simulator models 0.5.23; where fleetgen relies on a behaviour it must hold in both: speculation is
proven by the verify-call counter moving right after a request (the averages appear only after "Decode batch"
lines), the served name is `/v1/models`' root, `model_type` is the hf_config's, MTP logs two "KV Cache is
allocated" lines, and every metric and /server_info key fleetgen reads exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fleetgen.deploy.verify import judge_spec, spec_evidence
from fleetgen.engines import get_engine
from fleetgen.http.metrics import Scrape
from tests.fixtures.sim import SimFactory

DATA = Path(__file__).parents[2] / "data"
REAL = DATA / "real-engines" / "sglang-0.5.15-h200" / "mtp"
MODEL = DATA / "models" / "qwen3.6-27b"
SGLANG = get_engine("sglang")
CAPACITY_LINES = (
    r"type=Qwen3_5ForCausalLMMTP, .*mem usage=([\d.]+) GB",
    r"max_mamba_cache_size: (\d+)",
    r"max_total_num_tokens=.*max_running_requests=(\d+)",
)
# The real run's flags (fleet-mtp.toml), on a simulated 140.4 GiB GPU.
MTP = dict(
    context_length=8192,
    mem_fraction_static=0.85,
    reasoning_parser="qwen3",
    speculative_algorithm="EAGLE",
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
    mamba_radix_cache_strategy="extra_buffer",
    served_model_name="qwen3.6-27b",
    enable_metrics=True,
    sim_gpu_memory_gib=140.4,
    sim_decode_tps=0,
)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def _chat(session: aiohttp.ClientSession, url: str) -> Any:
    body = {"model": "qwen3.6-27b", "messages": [{"role": "user", "content": "one two"}], "max_tokens": 24}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_the_simulated_mtp_server_shows_what_real_sglang_shows(sim_server: SimFactory) -> None:
    real_metrics = Scrape.parse((REAL / "metrics-after-chat.txt").read_text()).samples
    real_info: dict[str, Any] = json.loads((REAL / "server_info.json").read_text())
    real_models = json.loads((REAL / "v1_models.json").read_text())
    real_model_info = json.loads((REAL / "model_info.json").read_text())
    async with sim_server("--model-path", str(MODEL), **MTP) as srv, aiohttp.ClientSession() as session:
        _, text = await _get(session, srv.base_url + "/metrics")
        before = Scrape.parse(text).samples
        chat = await _chat(session, srv.base_url)
        _, text = await _get(session, srv.base_url + "/metrics")
        after = Scrape.parse(text).samples
        info = json.loads((await _get(session, srv.base_url + "/server_info"))[1])
        models = json.loads((await _get(session, srv.base_url + "/v1/models"))[1])
        model_info = json.loads((await _get(session, srv.base_url + "/model_info"))[1])
        log = srv.log_text()
    # every metric fleetgen reads exists in both, speculation proven the same way right after the request
    assert set(SGLANG.metrics.read) <= set(real_metrics) and set(SGLANG.metrics.read) <= set(after)
    evidence = spec_evidence(SGLANG, before, after, info)
    assert evidence.steps and evidence.steps > 0
    assert judge_spec("sim", evidence)[0] is None
    # the chat response's shape (keys of the response, the choice and the message)
    real_chat = json.loads((REAL / "chat.json").read_text())
    assert set(chat) == set(real_chat)
    assert set(chat["choices"][0]) == set(real_chat["choices"][0])
    assert set(chat["choices"][0]["message"]) == set(real_chat["choices"][0]["message"])
    # /v1/models root and model_type as the real server reports them
    assert models["data"][0]["root"] == real_models["data"][0]["root"] == "qwen3.6-27b"
    assert model_info["model_type"] == real_model_info["model_type"]
    # /server_info: the keys fleetgen reads, in both
    for flags in SGLANG.view_checks:
        keys = [flag.replace("-", "_") for flag in flags]
        assert any(k in real_info for k in keys) and any(k in info for k in keys), keys
    assert set(SGLANG.capacity([], info, {})) == set(SGLANG.capacity([], real_info, {}))
    # MTP: the target's and the draft's KV pools, two lines with the same #tokens
    real_kv = [
        x for x in (REAL / "startup-key-lines.txt").read_text().splitlines() if "KV Cache is allocated" in x
    ]
    sim_kv = [x for x in log.splitlines() if "KV Cache is allocated" in x]
    assert len(real_kv) == len(sim_kv) == 2
    # the draft's own load and the pools it leaves: Mamba slots and max running as the real engine's
    real_log = (REAL / "startup-key-lines.txt").read_text()
    for pattern in CAPACITY_LINES:
        real_value, sim_value = _last(pattern, real_log), _last(pattern, log)
        assert sim_value == pytest.approx(real_value, rel=0.05), (pattern, sim_value, real_value)


def _last(pattern: str, text: str) -> float:
    found = re.findall(pattern, text)
    assert found, pattern
    return float(found[-1])


async def test_without_speculation_the_accept_gauges_exist_and_read_zero(sim_server: SimFactory) -> None:
    """Real SGLang exports `sglang:spec_accept_length` without speculation (0.0), and no verify counter."""
    real = Scrape.parse((REAL.parent / "nospec" / "metrics-after-chat.txt").read_text()).samples
    flags = {k: v for k, v in MTP.items() if not k.startswith("speculative")}
    async with sim_server("--model-path", str(MODEL), **flags) as srv, aiohttp.ClientSession() as session:
        await _chat(session, srv.base_url)
        sim = Scrape.parse((await _get(session, srv.base_url + "/metrics"))[1]).samples
    for samples in (real, sim):
        assert samples["sglang:spec_accept_length"] == 0.0
        assert "sglang:spec_verify_calls_total" not in samples
