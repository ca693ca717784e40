"""Many simulated endpoints in one process: each port answers as an SGLang 0.5.15 server would, cheaply.

    python bench/driver/loadgen.py --first-port P --num N --latency-s L --answer-tokens T --page PAGE

Not an engine: a load generator for `bench/driver/run_driver.py`, sized to cost the driver what real servers
cost it and to cost this machine as little as possible (a plain `asyncio.Protocol` with canned HTTP/1.1
answers, no HTTP framework). Per port:
- `GET /metrics`: the real page `PAGE` (SGLang 0.5.15 MTP: 530 lines, 64 families), its token counter moved
  by every answer (the hung guard's evidence of progress, as a real server's);
- `GET /health`, `GET /v1/models`: at once;
- `POST /v1/chat/completions`: after `L` s (± 50 %, uniform: servers out of step), an answer of `T` tokens
  (reasoning + content, ~4 characters a token), so `c` requests in flight per port come back at `c / L` a
  second: the job's rate.
It prints `ready` once every port listens, and counts what it served on SIGTERM (stderr, JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import resource
import signal
import sys
from collections import Counter
from pathlib import Path

COUNTER = "sglang:generation_tokens_total{"


def http(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: "
        + content_type
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Page:
    """The real /metrics page with its generated-token counter set to a server's own count."""

    def __init__(self, text: str) -> None:
        at = text.index(COUNTER)
        value_at = text.index("} ", at) + 2
        end = text.index("\n", value_at)
        self.head, self.tail = text[:value_at].encode(), text[end:].encode()

    def render(self, tokens: int) -> bytes:
        return http(self.head + str(float(tokens)).encode() + self.tail, b"text/plain; version=0.0.4")


class Port:
    """What one simulated server counts."""

    def __init__(self) -> None:
        self.tokens = 0


class Conn(asyncio.Protocol):
    """One keep-alive connection: requests in, canned answers out (a chat's after its latency)."""

    def __init__(self, gen: LoadGen, port: Port) -> None:
        self.gen, self.port, self.buf = gen, port, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end]
            length = 0
            lower = head.lower()
            if (at := lower.find(b"content-length:")) >= 0:
                stop = lower.find(b"\r\n", at)
                length = int(lower[at + 15 : stop if stop >= 0 else len(lower)])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            self.answer(head.split(b" ", 2)[1])

    def answer(self, path: bytes) -> None:
        gen = self.gen
        gen.served[path.decode()] += 1
        if path == b"/v1/chat/completions":
            delay = gen.latency_s * (0.5 + random.random())
            asyncio.get_running_loop().call_later(delay, self.reply)
            return
        if path == b"/metrics":
            self.write(gen.page.render(self.port.tokens))
        elif path == b"/v1/models":
            self.write(gen.models)
        else:
            self.write(http(b"ok", b"text/plain"))

    def reply(self) -> None:
        self.port.tokens += self.gen.answer_tokens
        self.write(self.gen.completion)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)


def prose(num_chars: int) -> str:
    """Text that reads as text to the quality checks (`generate.quality`: it compresses as prose does, it does
    not loop): words of random letters, seeded. A run of one letter would be a degenerate answer, which the
    checks rightly take their slow path on."""
    rng = random.Random(7)
    words: list[str] = []
    while sum(map(len, words)) + len(words) < num_chars:
        words.append("".join(rng.choices("etaoinshrdlucmfwypvbgkqjxz", k=rng.randint(2, 9))))
    return " ".join(words)[:num_chars]


class LoadGen:
    def __init__(self, page: str, latency_s: float, answer_tokens: int) -> None:
        self.page = Page(page)
        self.latency_s = latency_s
        self.answer_tokens = answer_tokens
        self.served: Counter[str] = Counter()
        self.models = http(json.dumps({"object": "list", "data": [{"id": "bench-model"}]}).encode())
        text = prose(answer_tokens * 4)
        split = len(text) // 4
        message = {"role": "assistant", "content": text[:split], "reasoning_content": text[split:]}
        self.completion = http(
            json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": "bench-model",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": answer_tokens},
                }
            ).encode()
        )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-port", type=int, required=True)
    ap.add_argument("--num", type=int, required=True)
    ap.add_argument("--latency-s", type=float, required=True)
    ap.add_argument("--answer-tokens", type=int, default=1800)
    ap.add_argument("--page", type=Path, required=True)
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    gen = LoadGen(args.page.read_text(), args.latency_s, args.answer_tokens)
    loop = asyncio.get_running_loop()
    servers = []
    for port in range(args.first_port, args.first_port + args.num):
        factory = functools.partial(Conn, gen, Port())
        servers.append(await loop.create_server(factory, "127.0.0.1", port, backlog=128))
    print("ready", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print(json.dumps(dict(gen.served)), file=sys.stderr, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
