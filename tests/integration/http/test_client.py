"""The one engine client against the simulated SGLang server (a real process): whether it owns its session
(a job, bench, the scraper) or borrows one shared with other engines (deploy, status, the dashboard), the key
goes with every request, a refusal is a non-retryable `RequestFailed` naming the status, and every call
reads the same server the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from fleetgen.errors import EndpointError
from fleetgen.http.client import EngineClient, RequestFailed
from tests.fixtures.sim import SimFactory

BODY = {"model": "m", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 8}


async def _clients(url: str, api_key: str | None) -> AsyncIterator[EngineClient]:
    async with EngineClient(url, api_key=api_key, max_connections=2) as owned:
        yield owned
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer other-engines-key"}) as shared:
        yield EngineClient(url, api_key=api_key, session=shared)


async def test_owned_or_borrowed_the_key_goes_with_every_request(sim_server: SimFactory) -> None:
    async with sim_server(
        api_key="sekret", served_model_name="m", enable_metrics=True, sim_output_tokens=8
    ) as (url, _):
        seen = []
        async for client in _clients(url, "sekret"):
            reply = await client.chat(BODY)
            events = [
                event
                async for event in client.stream_chat(
                    {**BODY, "stream": True, "stream_options": {"include_usage": True}}
                )
            ]
            scrape = await client.metrics()
            seen.append((await client.served_model(), reply.finish_reason, await client.is_healthy()))
            assert reply.completion_tokens == 8 and reply.content
            assert any(e.has_text for e in events) and scrape.samples
            assert [e.completion_tokens for e in events if e.completion_tokens is not None] == [8]
        assert seen == [("m", "stop", True)] * 2  # the sim ends its 8 tokens itself
        async for client in _clients(url, None):
            with pytest.raises(RequestFailed) as refused:
                await client.chat(BODY)
            assert refused.value.status == 401 and not refused.value.is_retryable
            assert refused.value.kind == "http_401"


async def test_a_view_that_is_not_there_or_not_json_names_the_fix(sim_server: SimFactory) -> None:
    async with (
        sim_server(served_model_name="m", enable_metrics=True) as (url, _),
        EngineClient(url) as client,
    ):
        with pytest.raises(EndpointError) as absent:
            await client.info(["/no-such-view"])
        with pytest.raises(EndpointError) as not_json:
            await client.get_json("/metrics")
    assert "/no-such-view" in absent.value.message and "engine.kind" in absent.value.fix
    assert "did not return JSON" in not_json.value.message and "http://host:port" in not_json.value.fix
