"""The simulated SGLang server's OpenAI chat endpoint, fault injection, auth and crash, over real HTTP.

SGLang cannot run here (no GPU); the simulator's real process stands in for it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from tests.fixtures.sim import SimFactory
from tests.integration.sim.test_server import CHAT, get_json, post_chat, user


async def stream_chat(url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + CHAT, json={**body, "stream": True}) as resp,
    ):
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return events


async def test_non_stream_reasoning_is_separate(sim_server: SimFactory) -> None:
    async with sim_server(reasoning_parser="qwen3", sim_output_tokens=200) as (url, _):
        status, body = await post_chat(url, user("Why is the sky blue?"))
    assert status == 200
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]
    assert "</think>" not in message["content"] and "</think>" not in message["reasoning_content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["completion_tokens"] == 200 and usage["reasoning_tokens"] == 150
    assert usage["total_tokens"] == usage["prompt_tokens"] + 200


async def test_stream_matches_non_stream(sim_server: SimFactory) -> None:
    body = user("hello", seed=5, stream_options={"include_usage": True})
    async with sim_server(reasoning_parser="qwen3", sim_output_tokens=120, stream_interval=4) as (url, _):
        events = await stream_chat(url, body)
        _, whole = await post_chat(url, user("hello", seed=5))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    message = whole["choices"][0]["message"]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == 120


async def test_thinking_off_and_no_parser(sim_server: SimFactory) -> None:
    off = user("hi", chat_template_kwargs={"enable_thinking": False})
    async with sim_server(reasoning_parser="qwen3", sim_output_tokens=60) as (url, _):
        _, body = await post_chat(url, off)
        _, unsplit = await post_chat(url, user("hi", separate_reasoning=False))
    assert body["choices"][0]["message"]["reasoning_content"] is None
    assert (
        body["usage"]["reasoning_tokens"] == 0 and len(body["choices"][0]["message"]["content"].split()) == 60
    )
    assert "</think>" in unsplit["choices"][0]["message"]["content"]


async def test_seed_is_deterministic_and_n_samples(sim_server: SimFactory) -> None:
    async with sim_server(sim_output_tokens=30, served_model_name="tiny") as (url, _):
        _, first = await post_chat(url, user("hi", seed=3, n=2))
        _, again = await post_chat(url, user("hi", seed=3, n=2))
        models = await get_json(url, "/v1/models")
    assert [c["message"] for c in first["choices"]] == [c["message"] for c in again["choices"]]
    assert first["choices"][0]["message"] != first["choices"][1]["message"]
    assert first["usage"]["completion_tokens"] == 60
    assert models["data"][0]["id"] == "tiny"


async def test_max_tokens_and_length_directives(sim_server: SimFactory) -> None:
    async with sim_server(reasoning_parser="qwen3") as (url, _):
        _, cut = await post_chat(url, user("hi", max_tokens=10))
        _, forced = await post_chat(url, user("hi [[sim:finish=length]] [[sim:tokens=40]]"))
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 10
    assert cut["choices"][0]["matched_stop"] is None
    assert forced["choices"][0]["finish_reason"] == "length" and forced["usage"]["completion_tokens"] == 40


async def test_status_injection_per_distinct_message(sim_server: SimFactory) -> None:
    async with sim_server(sim_output_tokens=20) as (url, _):
        results = [await post_chat(url, user("a [[sim:status=429:times=2]]")) for _ in range(3)]
        other = await post_chat(url, user("b [[sim:status=503]]"))
        other_again = await post_chat(url, user("b [[sim:status=503]]"))
    assert [status for status, _ in results] == [429, 429, 200]
    assert results[0][1]["object"] == "error" and results[0][1]["code"] == 429
    assert other[0] == 503 and other_again[0] == 200


async def test_api_key(sim_server: SimFactory) -> None:
    async with sim_server(api_key="sekret", sim_output_tokens=5) as (url, _):
        denied = await post_chat(url, user("hi"))
        wrong = await post_chat(url, user("hi"), headers={"Authorization": "Bearer nope"})
        allowed = await post_chat(url, user("hi"), headers={"Authorization": "Bearer sekret"})
        async with aiohttp.ClientSession() as session, session.get(url + "/health") as resp:
            health = resp.status
    assert denied == (401, {"error": "Unauthorized"}) and wrong[0] == 401
    assert allowed[0] == 200 and health == 200


async def test_crash_after(sim_server: SimFactory) -> None:
    async with sim_server(sim_crash_after=2, sim_output_tokens=5) as srv:
        assert (await post_chat(srv.base_url, user("1")))[0] == 200
        assert (await post_chat(srv.base_url, user("2")))[0] == 200
        try:
            await post_chat(srv.base_url, user("3"))
            raise AssertionError("the third request should have found the server dead")
        except aiohttp.ClientError:
            pass
        code = await asyncio.wait_for(srv.process.wait(), 10)
        assert code == -9
        assert "CUDA error: an illegal memory access was encountered" in srv.log_text()


async def test_queue_beyond_max_running_requests(sim_server: SimFactory) -> None:
    flags = dict(max_running_requests=2, sim_decode_tps=100, sim_output_tokens=100, enable_metrics=True)
    async with sim_server(**flags) as (url, _):
        tasks = [asyncio.create_task(post_chat(url, user(str(i)))) for i in range(5)]
        async with asyncio.timeout(10):  # until all 5 arrived (each then runs ~1 s): a hang guard only
            while True:
                load = (await get_json(url, "/v1/loads"))["loads"][0]
                if load["num_running_reqs"] + load["num_waiting_reqs"] == 5:
                    break
                await asyncio.sleep(0.05)
        results = await asyncio.gather(*tasks)
    assert load["num_running_reqs"] == 2 and load["num_waiting_reqs"] == 3
    assert all(status == 200 for status, _ in results)
