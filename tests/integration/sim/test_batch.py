"""The simulated SGLang server over real HTTP: out-of-range sampling values answered with SGLang's 400, the
batch admitted up to the cap `/server_info` reports, forced acceptance (`SGLANG_SIMULATE_ACC_LEN`) in the
log and /metrics, all with the roofline pace (`--sim-bandwidth-gbs`) a tuner measures."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from fleetgen.http.metrics import Scrape
from tests.fixtures.sim import SimFactory

CHAT = "/v1/chat/completions"
# an H200's bandwidth, the simulated clock 4x the wall's: a 300-token answer takes ~1 s of wall time
ROOFLINE = dict(sim_bandwidth_gbs=4800, sim_time_scale=4, enable_metrics=True)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello there"}], **fields}


async def post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> tuple[int, str]:
    async with session.post(url + CHAT, json=payload) as resp:
        return resp.status, await resp.text()


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        return Scrape.parse(await resp.text()).samples


async def logged(log_text: Callable[[], str], needle: str) -> None:
    """Wait (up to 30 s) until the server's log shows `needle`."""
    for _ in range(300):
        if needle in log_text():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{needle!r} never logged:\n{log_text()[-2000:]}")


async def test_an_out_of_range_sampling_value_is_sglangs_400(sim_server: SimFactory) -> None:
    async with sim_server(**ROOFLINE) as srv, aiohttp.ClientSession() as session:
        answers = [await post(session, srv.base_url, body(top_p=5, stream=s)) for s in (False, True)]
        bad_k = await post(session, srv.base_url, body(top_k=0, max_tokens=4))
        metrics = await scrape(session, srv.base_url)
        good = await post(session, srv.base_url, body(top_p=1, top_k=-1, temperature=0, max_tokens=4))
    for status, text in answers:
        assert status == 400
        assert json.loads(text) == {
            "object": "error",
            "message": "top_p must be in (0, 1], got 5.0.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    assert (
        bad_k[0] == 400
        and json.loads(bad_k[1])["message"] == "top_k must be -1 (disable) or at least 1, got 0."
    )
    # refused before the scheduler: nothing generated, no request counted
    assert sum(v for k, v in metrics.items() if k.startswith("sglang:generation_tokens_total")) == 0
    assert good[0] == 200, good[1]


async def test_the_batch_fills_up_to_the_cap_server_info_reports(sim_server: SimFactory) -> None:
    flags = dict(ROOFLINE, disable_radix_cache=True, max_running_requests=6, sim_output_tokens=300)
    async with sim_server(**flags) as srv, aiohttp.ClientSession() as session:
        async with session.get(srv.base_url + "/server_info") as resp:
            info = await resp.json()
        tasks = [asyncio.create_task(post(session, srv.base_url, body(seed=i))) for i in range(15)]
        running, queued = [], []
        while not all(t.done() for t in tasks):
            samples = await scrape(session, srv.base_url)
            running.append(samples["sglang:num_running_reqs"])
            queued.append(samples["sglang:num_queue_reqs"])
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*tasks)
        after = await scrape(session, srv.base_url)
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 6
    assert max(running) == 6 and max(queued) > 0
    assert all(status == 200 for status, _ in results)
    generated = sum(v for k, v in after.items() if k.startswith("sglang:generation_tokens_total"))
    assert generated == 15 * 300


async def test_forced_acceptance_shows_in_the_log_and_metrics(
    sim_server: SimFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3.0")
    flags = dict(ROOFLINE, speculative_algorithm="EAGLE", sim_accept_length=2.2, sim_output_tokens=600)
    async with sim_server(**flags) as srv, aiohttp.ClientSession() as session:
        status, _ = await post(session, srv.base_url, body())
        await logged(srv.log_text, "accept len: ")  # a Decode batch line: about once a second
        metrics = await scrape(session, srv.base_url)
    assert status == 200
    decode = [line for line in srv.log_text().splitlines() if "Decode batch" in line and "accept len" in line]
    assert all("accept len: 3.00, " in line for line in decode), decode
    assert metrics["sglang:spec_accept_length"] == 3.0
    # one token from prefill, then (600 - 1) / 3 verify steps
    assert metrics["sglang:spec_verify_calls_total"] == pytest.approx(600 // 3, abs=1)
