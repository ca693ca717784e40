"""The chat call's keep-alive transport (`fleetgen.http.keepalive`) against real HTTP servers on 127.0.0.1:
aiohttp's web server (answers with a length, chunked, `Connection: close`, a short keep-alive) and plain
asyncio servers for what no framework sends (no HTTP at all, an answer cut short, one that runs to the
connection's end). What must hold whatever the server does: every answer is its own request's, a connection is
reused only after a whole answer, and a failure is the kind the dispatcher acts on (`RequestFailed`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgen.http.client import EngineClient, RequestFailed
from fleetgen.http.keepalive import Answer, KeepAlive, MalformedAnswer, ServerDisconnected

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Peers:
    """The connections a server saw: opened, and still open."""

    def __init__(self) -> None:
        self.opened = 0
        self.open: set[object] = set()

    def saw(self, transport: object) -> None:
        if transport not in self.open:
            self.open.add(transport)
            self.opened += 1


@contextlib.asynccontextmanager
async def web_server(handler: Handler, keepalive_s: float = 75.0) -> AsyncIterator[tuple[str, Peers]]:
    """aiohttp's server on a free port, counting the connections its requests came on."""
    peers = Peers()

    async def counted(request: web.Request) -> web.StreamResponse:
        peers.saw(request.transport)
        return await handler(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", counted)
    runner = web.AppRunner(app, keepalive_timeout=keepalive_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", peers
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def raw_server(answer: bytes, then_close: bool = True) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A plain TCP server that reads a request's head and writes `answer` (any bytes), then closes, or
    with `then_close=False` waits for the client to close (the event: a client closed a connection)."""
    client_closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            if then_close:
                writer.close()
                return
            while await reader.read(65536):
                pass
            client_closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions", client_closed
    finally:
        server.close()


async def echo(request: web.Request) -> web.StreamResponse:
    """The request's id back after a random short wait, as a length, chunked, or closing answer."""
    doc = orjson.loads(await request.read())
    await asyncio.sleep(random.uniform(0, 0.01))
    body = orjson.dumps({"id": doc["id"], "pad": "x" * doc.get("pad", 0)})
    if doc.get("chunked"):
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        if doc.get("close"):
            response.force_close()
        await response.prepare(request)
        for at in range(0, len(body), 700):
            await response.write(body[at : at + 700])
        await response.write_eof()
        return response
    response = web.Response(body=body, content_type="application/json")
    if doc.get("close"):
        response.force_close()  # "Connection: close", and the server closes after it
    return response


async def test_every_answer_is_its_own_requests_and_connections_are_reused() -> None:
    """Many requests at once over one pool, answers of every framing in random order: each answer carries
    its own request's id; connections opened never exceed the requests in flight, except where an answer
    said `Connection: close` (never reused: each such answer costs one connection more)."""
    async with web_server(echo) as (url, peers):
        pool = KeepAlive(url, {"Content-Type": "application/json"}, timeout_s=10)
        rng = random.Random(7)
        docs = [
            {
                "id": i,
                "pad": rng.choice([0, 9000, 40000]),
                "chunked": rng.random() < 0.3,
                "close": rng.random() < 0.1,
            }
            for i in range(400)
        ]
        in_flight = asyncio.Semaphore(16)

        async def send(doc: dict[str, int]) -> Answer:
            async with in_flight:
                return await pool.post(orjson.dumps(doc))

        answers = await asyncio.gather(*map(send, docs))
        pool.close()
    assert [a.status for a in answers] == [200] * len(docs)
    assert [orjson.loads(a.body)["id"] for a in answers] == [d["id"] for d in docs]
    assert [len(orjson.loads(a.body)["pad"]) for a in answers] == [d["pad"] for d in docs]
    closing = sum(bool(d["close"]) for d in docs)
    assert peers.opened <= 16 + closing
    assert peers.opened >= closing  # each closing answer ended its connection


async def test_a_timed_out_request_never_lends_its_late_answer_to_the_next() -> None:
    """A request past its timeout raises TimeoutError and its connection is closed: the next request gets
    its own answer, never the late one."""

    async def slow_first(request: web.Request) -> web.StreamResponse:
        doc = orjson.loads(await request.read())
        await asyncio.sleep(0.5 if doc["id"] == 0 else 0)
        return web.Response(body=orjson.dumps({"id": doc["id"]}))

    async with web_server(slow_first) as (url, peers):
        pool = KeepAlive(url, {}, timeout_s=0.2)
        with pytest.raises(TimeoutError):
            await pool.post(b'{"id": 0}')
        await asyncio.sleep(0.5)  # the late answer, had the connection been kept, would be waiting now
        answers = [await pool.post(b'{"id": %d}' % i) for i in range(1, 4)]
        pool.close()
    assert [orjson.loads(a.body)["id"] for a in answers] == [1, 2, 3]
    assert peers.opened == 2  # the timed-out one's, then one kept for the three
    async with raw_server(b"", then_close=False) as (silent, closed):  # never answers
        pool = KeepAlive(silent, {}, timeout_s=0.2)
        with pytest.raises(TimeoutError):
            await pool.post(b"")
        await asyncio.wait_for(closed.wait(), 5)  # closed at the timeout, not left open to the pool's end
        pool.close()


async def test_a_connection_the_server_closed_while_kept_is_replaced_unseen() -> None:
    """The server's keep-alive ends between two requests: the second goes out on a new connection and
    succeeds; nothing fails."""

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=await request.read())

    async with web_server(answer, keepalive_s=0.05) as (url, peers):
        pool = KeepAlive(url, {}, timeout_s=5)
        first = await pool.post(b"one")
        await asyncio.sleep(0.3)
        second = await pool.post(b"two")
        pool.close()
    assert (first.body, second.body) == (b"one", b"two")
    assert peers.opened == 2


async def test_a_kept_connection_closed_as_the_request_went_out_is_retried_once_on_a_new_one() -> None:
    """The race a keep-alive timeout leaves: the server closes a kept connection as the next request goes
    out on it, before a byte of an answer. The request goes again on a new connection and is answered; an
    answer cut short after its first byte is not retried (the server had answered: it is down)."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the next request on a kept connection: closed unanswered
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    pool = KeepAlive(url, {}, timeout_s=5)
    bodies = [(await pool.post(b"")).body for _ in range(3)]
    pool.close()
    server.close()
    assert bodies == [b"ok"] * 3
    assert connections == 3  # each kept one closed under the next request, which a new one answered

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for reply in (answer, answer[:-1]):  # the second answer's last byte never comes
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
        writer.close()

    connections = 0
    server = await asyncio.start_server(cut, "127.0.0.1", 0)
    pool = KeepAlive(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", {}, timeout_s=5)
    assert (await pool.post(b"")).body == b"ok"
    with pytest.raises(ServerDisconnected):
        await pool.post(b"")
    pool.close()
    server.close()
    assert connections == 1


async def test_a_client_that_keeps_nothing_leaves_no_connection_open() -> None:
    """`keep=False` (a borrowed session's client: it has no close of its own) closes each connection after
    its answer; a keeping pool holds it until `close()`."""
    for keep in (False, True):
        async with raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", then_close=False) as (
            url,
            ended,
        ):
            pool = KeepAlive(url, {}, timeout_s=5, keep=keep)
            assert (await pool.post(b"")).body == b"ok"
            if keep:
                await asyncio.sleep(0.05)
                assert not ended.is_set()
                pool.close()
            await asyncio.wait_for(ended.wait(), 5)


async def test_max_connections_bounds_the_connections_opened() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.01)
        return web.Response(body=await request.read())

    async with web_server(answer) as (url, peers):
        pool = KeepAlive(url, {}, timeout_s=5, max_connections=3)
        answers = await asyncio.gather(*(pool.post(b"%d" % i) for i in range(40)))
        pool.close()
    assert [a.body for a in answers] == [b"%d" % i for i in range(40)]
    assert peers.opened == 3


@pytest.mark.parametrize(
    ("answer", "error", "is_connection"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40, ServerDisconnected, True),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", MalformedAnswer, False),
        (b"", ServerDisconnected, True),
    ],
    ids=["cut-short", "not-http", "closed-unanswered"],
)
async def test_a_broken_answer_is_the_failure_the_dispatcher_acts_on(
    answer: bytes, error: type[Exception], is_connection: bool
) -> None:
    """An answer cut short or a connection closed unanswered is a lost connection (the server is down:
    drained), bytes that are no HTTP a retryable failure of the request; neither is a reply."""
    async with raw_server(answer) as (url, _):
        with pytest.raises(error):
            await KeepAlive(url, {}, timeout_s=5).post(b"{}")
        async with EngineClient(url.removesuffix("/v1/chat/completions")) as client:
            with pytest.raises(RequestFailed) as failed:
                await client.chat({"messages": []})
    assert failed.value.is_retryable and failed.value.is_connection is is_connection
    assert failed.value.status is None


async def test_an_answer_that_runs_to_the_connections_end_is_whole() -> None:
    """No length and not chunked: the body is everything up to the close (HTTP/1.1 allows it)."""
    body = orjson.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    async with raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + body) as (url, _):
        answer = await KeepAlive(url, {}, timeout_s=5).post(b"{}")
    assert answer == Answer(200, body)


async def test_nothing_listening_is_a_lost_connection_and_a_bad_url_fails_the_request() -> None:
    with contextlib.closing(__import__("socket").socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        async with EngineClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(RequestFailed) as refused:
                await client.chat({})
    assert refused.value.is_connection and refused.value.is_retryable
    async with EngineClient("") as nowhere:
        with pytest.raises(RequestFailed) as no_url:
            await nowhere.chat({})
    assert "not an http:// URL" in no_url.value.message


async def test_a_connection_not_made_in_time_is_said_as_such_not_as_the_requests_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connect has its own bound (10 s) inside the exchange's (the job's request timeout, minutes): a
    failure says which ran out, and stays what the dispatcher retries without draining the server (as
    aiohttp's connect timeout was)."""
    monkeypatch.setattr("fleetgen.http.keepalive.CONNECT_TIMEOUT_S", 0)  # spent before the connect ends
    async with (
        raw_server(b"", then_close=False) as (url, _),
        EngineClient(url.removesuffix("/v1/chat/completions"), timeout_s=30) as client,
    ):
        with pytest.raises(RequestFailed) as failed:
            await client.chat({})
    assert "no connection to 127.0.0.1:" in failed.value.message and "within 0 s" in failed.value.message
    assert failed.value.is_retryable and not failed.value.is_connection


FRAMINGS = st.sampled_from(
    ["length", "chunked", "close", "interim+length", "interim+chunked", "interim+close"]
)


class _Wire(asyncio.Transport):
    """The transport side of one connection fed by hand: which bytes arrive in which `data_received` call
    cannot be chosen over a real socket (TCP coalesces and splits as it likes), so the parser is fed here."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def _framed(body: bytes, framing: str) -> bytes:
    if framing.startswith("interim+"):  # an interim answer first, which no exchange may take as its own
        return b"HTTP/1.1 100 Continue\r\n\r\n" + _framed(body, framing.removeprefix("interim+"))
    if framing == "chunked":
        chunks = b"".join(
            b"%x\r\n%b\r\n" % (len(body[i : i + 5]), body[i : i + 5]) for i in range(0, len(body), 5)
        )
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    if framing == "close":
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bodies=st.lists(st.binary(max_size=64), min_size=1, max_size=5),
    framings=st.lists(FRAMINGS, min_size=5, max_size=5),
    cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30),
)
def test_answers_split_anywhere_are_read_whole_and_in_order(
    bodies: list[bytes], framings: list[str], cuts: list[int]
) -> None:
    """Answers of any framing, an interim answer (100 Continue) before some, their bytes arriving in pieces
    cut anywhere, one after another on a connection kept while it may be: each exchange gets its own whole
    answer, never the interim one; after a `Connection: close` answer the connection is not reusable, after
    the others it is."""
    from fleetgen.http.keepalive import _Connection

    async def exchange_all() -> list[tuple[Answer, bool]]:
        seen = []
        connection = None
        for body, framing in zip(bodies, framings, strict=False):
            if connection is None or not connection.is_reusable:
                connection = _Connection()
                connection.connection_made(_Wire())
            answer = connection.exchange(b"POST / HTTP/1.1\r\n\r\n")
            data = _framed(body, framing)
            at, pieces = 0, iter(cuts * (len(data) + 1))
            while not answer.done() and at < len(data):
                step = next(pieces)
                connection.data_received(data[at : at + step])
                at += step
            seen.append((await answer, connection.is_reusable))
        return seen

    seen = asyncio.run(exchange_all())
    assert [answer for answer, _ in seen] == [Answer(200, body) for body in bodies]
    assert [reusable for _, reusable in seen] == [not f.endswith("close") for f in framings[: len(bodies)]]
