"""The sim's whole-server faults (`POST /sim/fault`, `--sim-fault`) and `--sim-answer-digest`, on a real sim
process through its real port: what a client sees of each mode, and that the server is whole again after.

"Never answered" is observed as no answer within a client timeout of a few seconds (the sim answers an ok
request in milliseconds); the request is then seen closed without an answer once the fault is lifted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from fleetgen.sim.text import DIGEST_TAG, prompt_digest
from tests.fixtures.sim import SimFactory

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
NO_ANSWER_S = 2.0  # how long "never answered" is watched


async def request(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None, timeout_s: float = 30
) -> tuple[int, Any]:
    """(status, JSON body or None) of one request."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.request(method, url, json=body, timeout=timeout) as resp:
        return resp.status, await resp.json(content_type=None) if await resp.read() else None


async def set_fault(session: aiohttp.ClientSession, url: str, mode: str, seconds: float | None = None) -> Any:
    status, body = await request(session, "POST", url + "/sim/fault", {"mode": mode, "seconds": seconds})
    assert status == 200, body
    return body


async def is_unanswered(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> bool:
    try:
        await request(session, method, url, body, timeout_s=NO_ANSWER_S)
    except TimeoutError:
        return True
    return False


async def assert_whole(session: aiohttp.ClientSession, url: str) -> None:
    """Every route answers again: health 200, a chat answer."""
    assert (await request(session, "GET", url + "/health"))[0] == 200
    status, body = await request(session, "POST", url + CHAT, BODY)
    assert status == 200 and body["choices"][0]["message"]["content"], body


@pytest.mark.parametrize("code", [500, 503])
async def test_http_errors_answer_every_generation_in_sglangs_error_shape(
    sim_server: SimFactory, code: int
) -> None:
    async with sim_server(sim_decode_tps=0) as (url, _), aiohttp.ClientSession() as session:
        assert await set_fault(session, url, f"http_{code}") == {"mode": f"http_{code}", "seconds": None}
        for _ in range(3):
            status, body = await request(session, "POST", url + CHAT, BODY)
            assert status == code
            assert body["object"] == "error" and body["code"] == code and "fleetgen.sim" in body["message"]
        assert (await request(session, "GET", url + "/health"))[0] == 200  # only generation fails
        assert (await request(session, "GET", url + "/server_info"))[0] == 200
        await set_fault(session, url, "ok")
        await assert_whole(session, url)


async def test_drop_closes_generation_connections_without_an_answer(sim_server: SimFactory) -> None:
    async with sim_server(sim_decode_tps=0) as (url, _), aiohttp.ClientSession() as session:
        await set_fault(session, url, "drop")
        for _ in range(3):
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await request(session, "POST", url + CHAT, BODY)
        assert (await request(session, "GET", url + "/health"))[0] == 200
        await set_fault(session, url, "ok")
        await assert_whole(session, url)


async def test_hang_answers_nothing_but_the_control_and_drops_what_it_held(sim_server: SimFactory) -> None:
    async with sim_server(sim_decode_tps=0) as (url, _), aiohttp.ClientSession() as session:
        await set_fault(session, url, "hang")
        held = asyncio.create_task(request(session, "POST", url + CHAT, BODY))
        for method, path in (("GET", "/health"), ("GET", "/health_generate"), ("GET", "/server_info")):
            assert await is_unanswered(session, method, url + path), path
        assert await is_unanswered(session, "POST", url + CHAT, BODY)
        assert not held.done()
        assert (await request(session, "GET", url + "/sim/fault"))[1] == {"mode": "hang", "seconds": None}
        await set_fault(session, url, "ok")
        with pytest.raises(aiohttp.ServerDisconnectedError):  # lifted: closed, never answered
            await held
        await assert_whole(session, url)


async def test_stall_holds_generation_while_health_says_200(sim_server: SimFactory) -> None:
    """sgl-project/sglang#6624, #30314: the health check vouches for a server that generates nothing."""
    async with sim_server(sim_decode_tps=0) as (url, _), aiohttp.ClientSession() as session:
        await set_fault(session, url, "stall")
        assert await is_unanswered(session, "POST", url + CHAT, {**BODY, "stream": True})
        assert await is_unanswered(session, "POST", url + CHAT, BODY)
        for path in ("/health", "/health_generate", "/server_info"):
            assert (await request(session, "GET", url + path))[0] == 200, path
        await set_fault(session, url, "ok")
        await assert_whole(session, url)


async def test_a_bounded_fault_ends_by_itself(sim_server: SimFactory) -> None:
    async with sim_server(sim_decode_tps=0) as (url, _), aiohttp.ClientSession() as session:
        body = await set_fault(session, url, "hang", 1.0)
        assert body["mode"] == "hang" and 0 < body["seconds"] <= 1.0
        with pytest.raises(aiohttp.ServerDisconnectedError):  # held until the second ran out, then closed
            await request(session, "POST", url + CHAT, BODY)
        assert (await request(session, "GET", url + "/sim/fault"))[1] == {"mode": "ok", "seconds": None}
        await assert_whole(session, url)


async def test_the_start_flag_the_api_key_and_bad_bodies(sim_server: SimFactory) -> None:
    """`--sim-fault` starts under a fault; the control is behind `--api-key` like every non-health route;
    a bad body is a 400 naming what is wrong, and changes nothing."""
    async with (
        sim_server(sim_decode_tps=0, sim_fault="http_503", api_key="k") as (url, _),
        aiohttp.ClientSession() as session,
    ):
        assert (await request(session, "POST", url + "/sim/fault", {"mode": "ok"}))[0] == 401
    async with (
        sim_server(sim_decode_tps=0, sim_fault="http_503", api_key="k") as (url, _),
        aiohttp.ClientSession(headers={"Authorization": "Bearer k"}) as session,
    ):
        assert (await request(session, "POST", url + CHAT, BODY))[0] == 503
        status, body = await request(session, "POST", url + "/sim/fault", {"mode": "sleep"})
        assert status == 400 and "mode must be one of ok, http_500" in body["message"]
        assert (await request(session, "GET", url + "/sim/fault"))[1] == {"mode": "http_503", "seconds": None}


async def test_the_answer_digest_names_the_prompt_it_answers(sim_server: SimFactory) -> None:
    """`--sim-answer-digest`: the answer begins with the digest of the request's system and user texts
    (assistant turns are not part of it), streamed or not."""
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "an earlier answer"},
        {"role": "user", "content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}]},
    ]
    tag = DIGEST_TAG + prompt_digest(["be brief", "first", "second"])
    body = {**BODY, "messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    async with (
        sim_server(sim_decode_tps=0, sim_answer_digest=True, reasoning_parser="qwen3") as (url, _),
        aiohttp.ClientSession() as session,
    ):
        status, answer = await request(session, "POST", url + CHAT, body)
        assert status == 200 and answer["choices"][0]["message"]["content"].startswith(tag + " "), answer
        async with session.post(url + CHAT, json={**body, "stream": True}) as resp:
            text = await resp.text()
        assert f'"content":"{tag} ' in text
