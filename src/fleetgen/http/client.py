"""HTTP to one engine, the only module that speaks to engines (the chat call's transport: keepalive.py):
health, its own view (info JSON, /v1/models), /metrics text, and chat completions (one reply, or a stream of
events).

A client owns an aiohttp session (`async with EngineClient(url, max_connections=N)`: keep-alive, at most N
sockets, excess requests queue here instead of opening connections; a job's dispatch, bench, the metrics
scraper) or borrows one (`session=`: deploy, status and the dashboard talk to many engines through one).
The chat call is the job's hot path: it goes out on the client's own keep-alive connections
(`fleetgen.http.keepalive`, not the session: a fraction of aiohttp's CPU a request; a borrowed session's
client keeps none open), the body serialized and the reply parsed once with orjson, nothing per token.

Errors are translated here, once: a chat request's into `RequestFailed`, classified for the dispatcher
(retryable: connection errors, timeouts, 408/409/425/429/5xx, an `abort` finish; any other 4xx is the
request's own fault), everything else into `EndpointError` carrying the URL. Engine differences in a reply
are normalized here too, in one reply (`Completion`) as in each streamed event (`StreamEvent`): SGLang returns
`reasoning_content`, vLLM 0.32 `reasoning`; a missing `content` is an empty answer; a missing usage is `None`;
token ids (`return_token_ids`) are vLLM 0.32's body `prompt_token_ids` + choice `token_ids`, SGLang 0.5.23's
choice `prompt_token_ids` + `response_token_ids`, else `None`.
The bodies sent are built by `fleetgen.http.request`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from fleetgen.errors import EndpointError
from fleetgen.http.keepalive import KeepAlive, MalformedAnswer
from fleetgen.http.metrics import Scrape
from fleetgen.http.request import probe_body

RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
FINISH_ALIASES = {"max_tokens": "length", "eos": "stop", "stop_sequence": "stop"}
CONTEXT_MARKERS = ("maximum context length", "context length", "too long", "longer than")


class RequestFailed(EndpointError):
    """One request failed. `is_retryable` decides retry vs error row; `is_connection` marks a dead server.

    Internal to generation: the dispatcher turns it into a retry or an error row, never into an exit.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status: int | None = None,
        is_retryable: bool,
        is_connection: bool = False,
    ) -> None:
        super().__init__(message, context={"url": url, "status": status})
        self.status = status
        self.is_retryable = is_retryable
        self.is_connection = is_connection

    @property
    def kind(self) -> str:
        """A short class of failure for the error table."""
        if self.status is None:
            return "connection" if self.is_connection else "timeout_or_protocol"
        if self.status == 400 and any(m in self.message.lower() for m in CONTEXT_MARKERS):
            return "prompt_too_long"
        return f"http_{self.status}"


@dataclass(slots=True)
class Completion:
    """One normalized chat completion (one turn), whatever the engine called its fields."""

    content: str
    reasoning_content: str
    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None
    prompt_token_ids: list[int] | None = None  # the prompt as the engine tokenized it; the tokens it
    token_ids: list[int] | None = None  # generated (end of sequence included where it ended)


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a streamed chat completion, normalized as `Completion` is: the text it carries, and the
    usage the last event brings (None in the others)."""

    content: str
    reasoning_content: str
    prompt_tokens: int | None
    completion_tokens: int | None

    @property
    def has_text(self) -> bool:
        """Whether it carries tokens (answer or reasoning), not only a role or the usage."""
        return bool(self.content or self.reasoning_content)


class EngineClient:
    """HTTP to one engine at `base_url` (`http://host:port`, often the local end of a tunnel).

    With `session`, it borrows that session (its key and timeout go with each request); without, it is an
    async context manager that owns one (`max_connections`: 0 is no limit).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        max_connections: int = 0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._chat_url = self.base_url + "/v1/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._max_connections = max_connections
        self._session = session
        self._is_owner = session is None
        self._per_request: dict[str, Any] = {}
        if session is not None:
            self._per_request = {"headers": self._headers, "timeout": self._timeout}
        # The chat call's own transport (the hot path, keepalive.py); a borrowed session's client has no
        # lifetime to close kept connections in, so it keeps none.
        self._chat = KeepAlive(
            self._chat_url,
            self._headers,
            timeout_s=timeout_s,
            keep=self._is_owner,
            max_connections=max_connections,
        )

    async def __aenter__(self) -> EngineClient:
        if self._is_owner:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=self._max_connections,
                ttl_dns_cache=300,
                enable_cleanup_closed=True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=self._timeout,
                skip_auto_headers=("User-Agent",),
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._chat.close()
        if self._is_owner and self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("EngineClient used outside `async with`")
        return self._session

    async def _get(self, path: str, timeout_s: float | None = None) -> tuple[int, bytes]:
        url = self.base_url + path
        options = dict(self._per_request)
        if timeout_s is not None:
            options["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(url, **options) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EndpointError(
                f"GET {url} failed: {type(exc).__name__}: {exc}",
                context={"url": url},
                fix="check that the server is up and reachable (`fleetgen status`)",
            ) from exc

    async def is_healthy(self, path: str = "/health", timeout_s: float | None = None) -> bool:
        """True on HTTP 200; False while the engine refuses connections or answers 503 (still loading)."""
        try:
            status, _ = await self._get(path, timeout_s)
        except EndpointError:
            return False
        return status == 200

    async def get_text(self, path: str, timeout_s: float | None = None) -> str:
        """The body of GET `path` (e.g. the /metrics text); EndpointError unless it answers 200."""
        status, raw = await self._get(path, timeout_s)
        if status != 200:
            url = self.base_url + path
            raise EndpointError(
                f"GET {url} answered HTTP {status}",
                context={"url": url, "body": _error_text(raw)},
                fix="check that the server is up and ready (`fleetgen status`)",
            )
        return raw.decode(errors="replace")

    async def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        text = await self.get_text(path, timeout_s)
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise EndpointError(
                f"GET {self.base_url}{path} did not return JSON",
                context={"body": text[:500]},
                fix="check that the URL is the engine's (http://host:port, no /v1) and that it is up",
            ) from exc

    async def info(self, paths: Sequence[str]) -> Any:
        """The engine's own view: the first of `paths` that answers JSON (SGLang renamed /get_server_info to
        /server_info); None for an engine that has none (no paths)."""
        errors: list[str] = []
        for path in paths:
            try:
                return await self.get_json(path)
            except EndpointError as exc:
                errors.append(exc.message)
        if not errors:
            return None
        raise EndpointError(
            "the engine's info endpoint did not answer: " + "; ".join(errors),
            context={"url": self.base_url},
            fix="check that engine.kind names the engine it runs and that it is up (`fleetgen status`)",
        )

    async def metrics(self, path: str = "/metrics") -> Scrape:
        """One read of the engine's Prometheus text, parsed (`fleetgen.http.metrics`)."""
        return Scrape.parse(await self.get_text(path), time.monotonic())

    async def served_model(self) -> str:
        """The served model: the first id in /v1/models."""
        doc = await self.get_json("/v1/models", min(self._timeout.total or 30.0, 30.0))
        data = doc.get("data") if isinstance(doc, dict) else None
        first = data[0] if isinstance(data, list) and data else None
        if not isinstance(first, dict) or not first.get("id"):
            raise EndpointError(
                f"{self.base_url}/v1/models lists no model",
                fix="check the URL (http://host:port, no /v1) and that it is an OpenAI-compatible server "
                "that is up; or name the model (--model)",
                context={"url": self.base_url, "answer": str(doc)[:300]},
            )
        return str(first["id"])

    async def chat(self, body: Mapping[str, Any]) -> Completion:
        """Send one chat completion; return it normalized or raise `RequestFailed`."""
        try:
            status, raw = await self._chat.post(orjson.dumps(body))
        except (OSError, MalformedAnswer) as exc:  # TimeoutError is an OSError
            raise self._failed(exc) from exc
        if status != 200:
            raise self._refused(status, raw)
        return parse_completion(raw, self._chat_url)

    async def probe(self, model: str, timeout_s: float) -> RequestFailed | None:
        """Whether it takes work, shown by one tiny chat request (`request.probe_body`, one token): None when
        it answered (a refusal, 4xx, too: the server works, it refuses that request), else the failure: an
        error reply (5xx), a dropped connection (`is_connection`), or no answer within `timeout_s` (`status`
        None, not a connection: a busy server may only be slow)."""
        try:
            await asyncio.wait_for(self.chat(probe_body(model, 1)), timeout_s)
        except RequestFailed as exc:
            return None if exc.status is not None and not exc.is_retryable else exc
        except TimeoutError:
            return RequestFailed(
                f"no answer to a probe request within {timeout_s:g} s", url=self._chat_url, is_retryable=True
            )
        return None

    async def stream_chat(self, body: Mapping[str, Any]) -> AsyncIterator[StreamEvent]:
        """Send one streaming chat completion; yield its events (server-sent `data:` JSON), normalized, as
        they come."""
        try:
            async with self.session.post(
                self._chat_url, data=orjson.dumps(body), **self._per_request
            ) as resp:
                if resp.status != 200:
                    raise self._refused(resp.status, await resp.read())
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    yield parse_event(orjson.loads(data))
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: Exception) -> RequestFailed:
        dead = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
        is_dead = isinstance(exc, dead) or (isinstance(exc, OSError) and not isinstance(exc, TimeoutError))
        if is_dead:
            message = f"connection to {self.base_url} failed: {exc}"
        elif isinstance(exc, TimeoutError) and not str(exc):
            message = f"request to {self.base_url} failed: no answer within {self._timeout.total:g} s"
        else:
            message = f"request to {self.base_url} failed: {type(exc).__name__}: {exc}"
        return RequestFailed(message, url=self._chat_url, is_retryable=True, is_connection=is_dead)

    def _refused(self, status: int, raw: bytes) -> RequestFailed:
        retryable = status in RETRYABLE_STATUS or status >= 500
        return RequestFailed(
            f"HTTP {status}: {_error_text(raw)}", url=self._chat_url, status=status, is_retryable=retryable
        )


def parse_completion(raw: bytes, url: str) -> Completion:
    """Normalize one chat completion body into `Completion` (one shape whatever the engine)."""
    try:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        message = choice.get("message") or {}
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RequestFailed(f"unreadable completion: {raw[:200]!r}", url=url, is_retryable=True) from exc
    finish = choice.get("finish_reason")
    if isinstance(finish, dict):  # SGLang's native form {"type": "length", ...}
        finish = finish.get("type")
    finish = FINISH_ALIASES.get(finish, finish) if isinstance(finish, str) else "unknown"
    if finish == "abort":
        raise RequestFailed(
            "the engine aborted the request (finish_reason=abort)", url=url, is_retryable=True
        )
    usage = data.get("usage") or {}
    return Completion(
        content=message.get("content") or "",
        reasoning_content=_reasoning(message),
        finish_reason=finish,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        prompt_token_ids=_ids(choice.get("prompt_token_ids") or data.get("prompt_token_ids")),
        token_ids=_ids(choice.get("token_ids") or choice.get("response_token_ids")),
    )


def _ids(value: object) -> list[int] | None:
    """Token ids as an engine returns them; None where it returned none (or not a list of ints)."""
    return value if isinstance(value, list) and all(type(i) is int for i in value) else None


def parse_event(data: object) -> StreamEvent:
    """Normalize one streamed event (its first choice's `delta`, its `usage`) into `StreamEvent`."""
    event = data if isinstance(data, dict) else {}
    choices = event.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    delta = first.get("delta") if isinstance(first, dict) else None
    delta = delta if isinstance(delta, dict) else {}
    usage = event.get("usage")
    prompt = completion = None
    if isinstance(usage, dict):
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    content, reasoning = delta.get("content"), _reasoning(delta)
    return StreamEvent(
        content if isinstance(content, str) else "",
        reasoning if isinstance(reasoning, str) else "",
        prompt,
        completion,
    )


def _count(value: object) -> int:
    """A token count as a usage states it; 0 where it states none (or something that is not a number)."""
    return int(value) if isinstance(value, int | float) else 0


def _reasoning(message: Mapping[str, Any]) -> str:
    """The reasoning of a message or delta: SGLang names it `reasoning_content`, vLLM 0.32 `reasoning`."""
    return message.get("reasoning_content") or message.get("reasoning") or ""


def _error_text(raw: bytes) -> str:
    """The server's error message (OpenAI `{"error": {"message"}}`, FastAPI `detail`), else the raw text."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:500].decode(errors="replace").strip() or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])[:500]
    return raw[:500].decode(errors="replace")
