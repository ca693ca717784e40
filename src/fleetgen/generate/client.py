"""A lean OpenAI-compatible chat client over aiohttp, one per endpoint.

One `ClientSession` per endpoint with a connection limit equal to the dispatch cap (keep-alive, no per-
request connection setup), non-streaming requests, the body parsed once with orjson, nothing per token.

Engine differences are normalized here, once: SGLang returns `reasoning_content`, vLLM 0.32 `reasoning`
(older vLLM `reasoning_content`); a missing `content` is an empty answer; a missing usage is `None`.
Failures are classified for the dispatcher: retryable (connection errors, timeouts, 408/409/425/429/5xx,
an `abort` finish) or not (any other 4xx: the request itself is wrong).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from fleetgen.errors import EndpointError
from fleetgen.generate.work import Completion

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


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What `/v1/models` says: the served model name and its context length (when the engine reports it)."""

    model: str
    max_model_len: int | None
    owned_by: str | None


class ChatClient:
    """Chat completions against one base URL (`http://host:port`). An async context manager."""

    def __init__(
        self, base_url: str, *, max_connections: int, timeout_s: float, api_key: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._url = self.base_url + "/v1/chat/completions"
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ChatClient:
        # Keep-alive, and at most `cap` sockets: excess requests queue here, not as new connections.
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
            json_serialize=_dumps_str,
            skip_auto_headers=("User-Agent",),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("ChatClient used outside `async with`")
        return self._session

    async def chat(self, body: dict[str, Any]) -> Completion:
        """Send one chat completion; return it normalized or raise `RequestFailed`."""
        try:
            async with self.session.post(self._url, data=orjson.dumps(body)) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise RequestFailed(
                f"connection to {self.base_url} failed: {exc}",
                url=self._url,
                is_retryable=True,
                is_connection=True,
            ) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise RequestFailed(
                f"request to {self.base_url} failed: {type(exc).__name__}: {exc}",
                url=self._url,
                is_retryable=True,
            ) from exc
        if status != 200:
            retryable = status in RETRYABLE_STATUS or status >= 500
            raise RequestFailed(
                f"HTTP {status}: {_error_text(raw)}", url=self._url, status=status, is_retryable=retryable
            )
        return parse_completion(raw, self._url)

    async def is_healthy(self, timeout_s: float = 5.0) -> bool:
        """True when `GET /health` answers 200 within `timeout_s`."""
        try:
            async with self.session.get(
                self.base_url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def server_info(self) -> ServerInfo:
        """The served model (first of `/v1/models`); raises `EndpointError` when the endpoint cannot say."""
        url = self.base_url + "/v1/models"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise EndpointError(
                        f"GET /v1/models answered HTTP {resp.status}",
                        context={"url": url, "body": _error_text(raw)},
                        fix="check the endpoint is an OpenAI-compatible server that is up",
                    )
            first = orjson.loads(raw)["data"][0]
        except (
            TimeoutError,
            aiohttp.ClientError,
            orjson.JSONDecodeError,
            KeyError,
            IndexError,
            TypeError,
        ) as exc:
            raise EndpointError(
                f"cannot read the served model from {url}: {type(exc).__name__}: {exc}",
                context={"url": url},
                fix="check the URL (http://host:port, no /v1) and that the server is up",
            ) from exc
        max_len = first.get("max_model_len")
        return ServerInfo(
            str(first["id"]), int(max_len) if isinstance(max_len, int) else None, first.get("owned_by")
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
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    usage = data.get("usage") or {}
    return Completion(
        content=message.get("content") or "",
        reasoning_content=reasoning or "",
        finish_reason=finish,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
    )


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


def _dumps_str(value: Any) -> str:
    return orjson.dumps(value).decode()
