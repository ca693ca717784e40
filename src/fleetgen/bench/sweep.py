"""The load generator and statistics behind `fleetgen bench`.

A level is a closed loop: `concurrency` workers per instance, each sending one streaming chat completion after
another until the level's request budget is spent. From the stream we time the first token (TTFT) and the gap
between token-bearing chunks (ITL, per chunk like `vllm bench serve`: with speculative decoding one chunk can
carry several tokens). Output tokens come from the server's own `usage`, not from counting chunks.
Speculative accept length comes from the engine's /metrics (counter deltas, or its accept-length gauge), and
falls back to tokens per chunk seen in the stream (the server emits one chunk per decode step).

Life of a sweep: `sweep(targets, load)` → per target: resolve the model, calibrate words→tokens with one
probe, then for each concurrency level `run_level` → `LevelResult`. Failures are counted per level, never
raised, unless a whole level failed (then the endpoint is broken: `EndpointError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence

from fleetgen.bench.stats import (
    BenchLoad,
    BenchTarget,
    LevelResult,
    RequestSample,
    build_level,
    capped_levels,
    make_prompt,
    pooled_accept_length,
    read_event,
)
from fleetgen.engines import ENGINES
from fleetgen.errors import EndpointError
from fleetgen.http.client import EngineClient
from fleetgen.http.request import ChatRequests


def _asking(requests: ChatRequests, prompt: str) -> dict[str, object]:
    """The body that asks `prompt` as one user turn."""
    return requests.body([{"role": "user", "content": prompt}])


async def stream_one(client: EngineClient, body: Mapping[str, object]) -> RequestSample:
    """Send one streaming chat completion; time its chunks. Failures become a sample with `error`."""
    sample = RequestSample()
    start = last = time.perf_counter()
    try:
        async for event in client.stream_chat(body):
            last = read_event(sample, event, time.perf_counter(), start, last)
    except EndpointError as exc:
        sample.error = f"{exc.message} ({client.base_url})"
        return sample
    sample.is_ok = sample.num_chunks > 0 and sample.output_tokens > 0
    if not sample.is_ok:
        sample.error = f"{client.base_url} streamed no tokens (or no usage: does it honour include_usage?)"
    return sample


async def scrape(clients: Sequence[EngineClient]) -> list[dict[str, float]]:
    """Every endpoint's /metrics samples, one dict per client (kept apart: gauges do not add up across
    endpoints); {} for an endpoint that serves none (metrics are optional)."""
    snapshots: list[dict[str, float]] = []
    for client in clients:
        try:
            snapshots.append(dict((await client.metrics()).samples))
        except EndpointError:
            snapshots.append({})
    return snapshots


async def server_cap(client: EngineClient) -> int | None:
    """The server's own max running requests from its info JSON (every registered engine's info paths, each
    engine asked to read it); None when none says (vLLM)."""
    try:
        info = await client.info([p for e in ENGINES.values() for p in e.info_paths])
    except EndpointError:
        return None
    return next((n for e in ENGINES.values() if (n := e.max_running_from_info(info))), None)


# The probe's answer: a few tokens, not one. With a reasoning parser and a thinking template the first token
# can be the think marker, which the parser takes out of the stream: a one-token answer then streams no text.
PROBE_TOKENS = 8


async def words_per_token(client: EngineClient, load: BenchLoad, model: str) -> float:
    """Calibrate prompt words → prompt tokens with one probe (also warms the server up)."""
    num_words = max(16, load.input_len)
    prompt = make_prompt(num_words, random.Random(load.seed - 1))
    sample = await stream_one(client, _asking(load.requests(model, PROBE_TOKENS), prompt))
    if not sample.is_ok:
        raise EndpointError(
            f"the probe request failed: {sample.error}",
            fix="check the endpoint with `fleetgen status`; pass --model if the name is wrong",
            context={"url": client.base_url, "model": model},
        )
    return num_words / sample.prompt_tokens if sample.prompt_tokens > 0 else 1.0


async def run_level(
    target: BenchTarget,
    clients: Sequence[EngineClient],
    concurrency: int,
    load: BenchLoad,
    model: str,
    num_words: int,
) -> LevelResult:
    """`concurrency` workers per URL, closed loop, until the level's request budget is spent."""
    budget = load.num_requests(concurrency, len(clients))
    rng = random.Random(load.seed * 1_000_003 + concurrency)
    queue = iter([make_prompt(num_words, rng) for _ in range(budget)])  # made before the clock starts
    samples: list[RequestSample] = []
    requests = load.requests(model, load.output_len)

    async def worker(client: EngineClient) -> None:
        for prompt in queue:  # one shared iterator: each prompt is sent once
            samples.append(await stream_one(client, _asking(requests, prompt)))

    before = await scrape(clients)
    start = time.perf_counter()
    await asyncio.gather(*(worker(client) for client in clients for _ in range(concurrency)))
    duration = time.perf_counter() - start
    after = await scrape(clients)
    return build_level(target, concurrency, samples, duration, pooled_accept_length(before, after))


async def warm_up(
    clients: Sequence[EngineClient], concurrency: int, load: BenchLoad, model: str, num_words: int
) -> None:
    """One unmeasured burst of `concurrency` short requests per URL, so that the first measured level
    meets a warm server (its first batched prefill compiles kernels). Failures: the first level reports."""
    rng = random.Random(load.seed * 1_000_003 - concurrency)
    requests = load.requests(model, load.warmup_tokens)
    await asyncio.gather(
        *(
            stream_one(client, _asking(requests, make_prompt(num_words, rng)))
            for client in clients
            for _ in range(concurrency)
        )
    )


async def sweep(
    targets: Sequence[BenchTarget],
    load: BenchLoad,
    *,
    caps: Sequence[int | None] = (),
    on_level: Callable[[LevelResult], None] | None = None,
) -> list[LevelResult]:
    """Every target through every level, capped by the lowest of `caps` (known before: the user's, the
    plan's) and of the servers' own max running requests."""
    results: list[LevelResult] = []
    async with contextlib.AsyncExitStack() as stack:
        # max_connections=0: the connection pool must never be what caps concurrency.
        by_url = {
            url: await stack.enter_async_context(
                EngineClient(url, api_key=load.api_key, timeout_s=load.timeout_s, max_connections=0)
            )
            for url in dict.fromkeys(url for target in targets for url in target.urls)
        }
        for target in targets:
            clients = [by_url[url] for url in target.urls]
            model = load.model or await clients[0].served_model()
            known = [c for c in [*caps, *[await server_cap(client) for client in clients]] if c]
            ratio = await words_per_token(clients[0], load, model)
            num_words = max(1, round(load.input_len * ratio))
            levels = capped_levels(load.concurrencies, min(known, default=None))
            if levels and load.warmup_tokens:
                await warm_up(clients, levels[-1], load, model, num_words)
            for concurrency in levels:
                level = await run_level(target, clients, concurrency, load, model, num_words)
                if level.num_failed == level.num_requests:
                    raise EndpointError(
                        f"every request of {target.name} at concurrency {concurrency} failed",
                        fix="check the server's log (`fleetgen logs`) for the cause",
                        context={"first error": level.first_error},
                    )
                results.append(level)
                if on_level is not None:
                    on_level(level)
    return results
