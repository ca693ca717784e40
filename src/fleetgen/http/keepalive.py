"""Keep-alive HTTP/1.1 POSTs to one URL: the chat call's transport, the job's hot path.

One driver sends every completion of a fleet (~2,400 a second for 1,000 H200s of the README's job), so a
request's CPU is the driver's bound. aiohttp's request path (its session, connector, timer and response
layers) costs ~0.17 CPU ms a request on the build machine; a plain `asyncio.Protocol` whose answers are parsed
by httptools (llhttp in C, uvicorn's parser) ~0.05 (`bench/driver/chat_cost.py`, the answer's JSON parsed in
both). With the GC's change (`generate/heap.py`) it took the driver at 1,000 servers from ~0.75 to ~0.35 CPU
ms a completion on the GPU host's Xeon (bench/README.md "Round two"). That is all this module
does: the request's head is built once, the answer's status and body read by the parser, the connection kept
for the next request unless the server asked to close it. Every other call (GETs, streams) stays on aiohttp.

What HTTP/1.1 allows an answer to be is the parser's: a `Content-Length` body, a chunked one, or one that
runs to the connection's end (`connection_lost` completes it). Failures are Python's own: `OSError`s from
connecting, `ServerDisconnected` (a `ConnectionError`) when the connection ends before a whole answer,
`MalformedAnswer` for bytes that are no HTTP, `TimeoutError` past `timeout_s` for the whole exchange.
A connection whose exchange did not end in a whole answer (a timeout, a cancel, an error) is closed, never
reused: a late answer can never be read as the next request's. A kept connection that the server has closed
meanwhile (its keep-alive timeout) before a byte of the answer came is retried once on a new connection.
"""

from __future__ import annotations

import asyncio
import errno
import urllib.parse
from collections.abc import Mapping
from typing import NamedTuple, cast

import httptools

CONNECT_TIMEOUT_S = 10.0


class Answer(NamedTuple):
    """A whole HTTP answer: its status code and its body (de-chunked)."""

    status: int
    body: bytes


class ServerDisconnected(ConnectionError):
    """The connection ended before a whole answer came."""


class MalformedAnswer(Exception):
    """The server sent bytes that are no HTTP/1.1 answer."""


class _Connection(asyncio.Protocol):
    """One TCP connection: one exchange at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._answer: asyncio.Future[Answer] | None = None
        self._transport: asyncio.Transport | None = None
        self._has_length = False  # the answer names its end (Content-Length, or chunked)
        self._has_headers = False
        self.has_bytes = False  # any byte of the current answer arrived
        self.is_reusable = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a TCP connection's (uvloop's: no subclass)
        self.is_reusable = True

    def exchange(self, request: bytes) -> asyncio.Future[Answer]:
        """Send `request`; the future is its answer."""
        assert self._transport is not None and self._answer is None
        self._answer = asyncio.get_running_loop().create_future()
        self.has_bytes = self._has_headers = self._has_length = False
        self.is_reusable = False  # until its whole answer came
        self._transport.write(request)
        return self._answer

    def close(self) -> None:
        self.is_reusable = False
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self.has_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(MalformedAnswer(f"the server's answer is no HTTP/1.1: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_reusable = False
        if self._answer is None:
            return
        if self._has_headers and not self._has_length:  # an answer that runs to the connection's end
            self._complete()
        else:
            why = f": {exc}" if exc else ""
            self._end(ServerDisconnected(f"the server closed the connection before a whole answer{why}"))

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._has_length = True

    def on_headers_complete(self) -> None:
        self._has_headers = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete()

    def _complete(self) -> None:
        status, body = self._parser.get_status_code(), b"".join(self._body)
        self._body = []
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the answer is next
            self._has_headers = self._has_length = False
            return
        answer = Answer(status, body)
        waiting, self._answer = self._answer, None
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)
            is_open = self._transport is not None and not self._transport.is_closing()
            self.is_reusable = is_open and self._parser.should_keep_alive()

    def _end(self, exc: Exception) -> None:
        self._body = []
        waiting, self._answer = self._answer, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(exc)


class KeepAlive:
    """POSTs to one `url`, each on a kept connection or a new one; `keep=False` closes each after its
    answer (a client without a lifetime of its own: nothing is left open). `max_connections` > 0 makes
    excess requests wait here. Close with `close()`."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        timeout_s: float,
        keep: bool = True,
        max_connections: int = 0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        self._url = url
        self._host = parts.hostname if parts.scheme == "http" else None  # a POST to any other fails
        self._port = parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {target} HTTP/1.1", f"Host: {parts.netloc}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._timeout_s = timeout_s
        self._keep = keep
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def post(self, body: bytes) -> Answer:
        """The answer to one POST of `body`."""
        request = self._head + b"%d\r\n\r\n%b" % (len(body), body)
        async with asyncio.timeout(self._timeout_s):
            if self._slots is None:
                return await self._send(request)
            async with self._slots:
                return await self._send(request)

    def close(self) -> None:
        """Close every connection, kept or in use (an exchange in flight ends in `ServerDisconnected`)."""
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()

    async def _send(self, request: bytes) -> Answer:
        while True:
            connection, is_kept = await self._take()
            try:
                answer = await connection.exchange(request)
            except ServerDisconnected:
                self._open.discard(connection)
                if is_kept and not connection.has_bytes:  # it was closed while kept: not this request's fault
                    continue
                raise
            except BaseException:
                self._open.discard(connection)
                connection.close()
                raise
            self._give_back(connection)
            return answer

    async def _take(self) -> tuple[_Connection, bool]:
        while self._idle:
            connection = self._idle.pop()
            if connection.is_reusable:
                return connection, True
            self._open.discard(connection)
        if not self._host:
            raise OSError(errno.EINVAL, f"not an http:// URL: {self._url!r}")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, connection = await loop.create_connection(_Connection, self._host, self._port)
        except TimeoutError:  # its own words: not the whole exchange's timeout
            where = f"{self._host}:{self._port}"
            raise TimeoutError(f"no connection to {where} within {CONNECT_TIMEOUT_S:g} s") from None
        self._open.add(connection)
        return connection, False

    def _give_back(self, connection: _Connection) -> None:
        if self._keep and connection.is_reusable:
            self._idle.append(connection)
        else:
            self._open.discard(connection)
            connection.close()
