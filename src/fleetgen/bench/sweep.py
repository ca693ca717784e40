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
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import aiohttp

from fleetgen.bench.stats import (
    BenchLoad,
    BenchTarget,
    LevelResult,
    RequestSample,
    build_level,
    capped_levels,
    chat_body,
    make_prompt,
    parse_metrics,
    pooled_accept_length,
    read_event,
)
from fleetgen.engines import ENGINES, all_info_paths
from fleetgen.errors import EndpointError
from fleetgen.fleet.metrics import max_running_from_info

# Every registered engine's metric names: a bench target's engine is not known up front, and the names of
# different engines do not collide, so whichever engine's counters moved answers.
KNOWN_METRICS = tuple(engine.metrics for engine in ENGINES.values())


async def stream_one(
    session: aiohttp.ClientSession, url: str, body: Mapping[str, object], headers: Mapping[str, str]
) -> RequestSample:
    """Send one streaming chat completion; time its chunks. Failures become a sample with `error`."""
    sample = RequestSample()
    start = last = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                sample.error = f"HTTP {resp.status} from {url}: {(await resp.text())[:300]}"
                return sample
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                last = read_event(sample, json.loads(data), time.perf_counter(), start, last)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        sample.error = f"{type(exc).__name__} from {url}: {exc}"
        return sample
    sample.latency_s = time.perf_counter() - start
    if sample.num_chunks == 0 or sample.output_tokens == 0:
        sample.error = f"{url} streamed no tokens (or no usage; does it honour stream_options.include_usage?)"
        return sample
    sample.is_ok = True
    return sample


async def get_json(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> object:
    """GET a JSON document, translating transport errors into EndpointError."""
    try:
        async with session.get(url, headers=headers) as resp:
            if resp.status != 200:
                raise EndpointError(
                    f"GET {url} answered HTTP {resp.status}: {(await resp.text())[:300]}",
                    fix="check that the server is up and ready (`fleetgen status`)",
                    context={"url": url},
                )
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise EndpointError(
            f"GET {url} failed: {type(exc).__name__}: {exc}",
            fix="check that the server is up and reachable (`fleetgen status`)",
            context={"url": url},
        ) from exc


async def scrape(
    session: aiohttp.ClientSession, urls: Sequence[str], headers: Mapping[str, str]
) -> list[dict[str, float]]:
    """Every endpoint's /metrics samples, one dict per URL (kept apart: gauges do not add up across
    endpoints); {} for an endpoint that serves none (metrics are optional)."""
    snapshots: list[dict[str, float]] = []
    for url in urls:
        try:
            async with session.get(url + "/metrics", headers=headers) as resp:
                text = await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError):
            text = ""
        snapshots.append(parse_metrics(text))
    return snapshots


async def served_model(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> str:
    """The first model id in /v1/models."""
    doc = await get_json(session, url + "/v1/models", headers)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
        raise EndpointError(
            f"{url}/v1/models lists no model",
            fix="pass --model NAME",
            context={"url": url, "answer": str(doc)[:300]},
        )
    return str(data[0]["id"])


async def server_cap(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> int | None:
    """The server's own max running requests from its info JSON (any registered engine's info paths: SGLang's
    /server_info, or the deprecated /get_server_info); None when it does not say (vLLM)."""
    for path in all_info_paths():
        try:
            return max_running_from_info(await get_json(session, url + path, headers))
        except EndpointError:
            continue
    return None


async def words_per_token(
    session: aiohttp.ClientSession, url: str, load: BenchLoad, model: str, headers: Mapping[str, str]
) -> float:
    """Calibrate prompt words → prompt tokens with one probe (also warms the server up)."""
    num_words = max(16, load.input_len)
    body = chat_body(load, model, make_prompt(num_words, random.Random(load.seed - 1)), 1)
    sample = await stream_one(session, url, body, headers)
    if not sample.is_ok:
        raise EndpointError(
            f"the probe request failed: {sample.error}",
            fix="check the endpoint with `fleetgen status`; pass --model if the name is wrong",
            context={"url": url, "model": model},
        )
    return num_words / sample.prompt_tokens if sample.prompt_tokens > 0 else 1.0


async def run_level(
    session: aiohttp.ClientSession,
    target: BenchTarget,
    concurrency: int,
    load: BenchLoad,
    model: str,
    num_words: int,
    headers: Mapping[str, str],
) -> LevelResult:
    """`concurrency` workers per URL, closed loop, until the level's request budget is spent."""
    budget = load.num_requests(concurrency, len(target.urls))
    rng = random.Random(load.seed * 1_000_003 + concurrency)
    prompts = [make_prompt(num_words, rng) for _ in range(budget)]
    samples: list[RequestSample] = []
    queue = iter(prompts)

    async def worker(url: str) -> None:
        for prompt in queue:  # one shared iterator: each prompt is sent once
            samples.append(
                await stream_one(session, url, chat_body(load, model, prompt, load.output_len), headers)
            )

    before = await scrape(session, target.urls, headers)
    start = time.perf_counter()
    await asyncio.gather(*(worker(url) for url in target.urls for _ in range(concurrency)))
    duration = time.perf_counter() - start
    after = await scrape(session, target.urls, headers)
    accept = pooled_accept_length(before, after, KNOWN_METRICS)
    return build_level(target, concurrency, samples, duration, accept)


async def warm_up(
    session: aiohttp.ClientSession,
    target: BenchTarget,
    concurrency: int,
    load: BenchLoad,
    model: str,
    num_words: int,
    headers: Mapping[str, str],
) -> None:
    """One unmeasured burst of `concurrency` short requests per URL, so that the first measured level
    meets a warm server (its first batched prefill compiles kernels). Failures: the first level reports."""
    rng = random.Random(load.seed * 1_000_003 - concurrency)
    bodies = [
        chat_body(load, model, make_prompt(num_words, rng), load.warmup_tokens)
        for _ in range(concurrency * len(target.urls))
    ]
    urls = [url for url in target.urls for _ in range(concurrency)]
    await asyncio.gather(
        *(stream_one(session, url, body, headers) for url, body in zip(urls, bodies, strict=True))
    )


async def sweep(
    targets: Sequence[BenchTarget],
    load: BenchLoad,
    *,
    cap: int | None = None,
    on_level: Callable[[LevelResult], Awaitable[None] | None] | None = None,
) -> list[LevelResult]:
    """Every target through every level (capped by `cap` and by the servers' own max running requests)."""
    headers = {"Authorization": f"Bearer {load.api_key}"} if load.api_key else {}
    timeout = aiohttp.ClientTimeout(total=load.timeout_s)
    # limit=0: the connection pool must never be what caps concurrency.
    connector = aiohttp.TCPConnector(limit=0)
    results: list[LevelResult] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for target in targets:
            first = target.urls[0]
            model = load.model or await served_model(session, first, headers)
            caps = [c for c in [cap, *[await server_cap(session, u, headers) for u in target.urls]] if c]
            ratio = await words_per_token(session, first, load, model, headers)
            num_words = max(1, round(load.input_len * ratio))
            levels = capped_levels(load.concurrencies, min(caps) if caps else None)
            if levels and load.warmup_tokens:
                await warm_up(session, target, levels[-1], load, model, num_words, headers)
            for concurrency in levels:
                level = await run_level(session, target, concurrency, load, model, num_words, headers)
                if level.num_failed == level.num_requests:
                    raise EndpointError(
                        f"every request of {target.name} at concurrency {concurrency} failed",
                        fix="check the server's log (`fleetgen logs`) for the cause",
                        context={"first error": level.first_error},
                    )
                results.append(level)
                if on_level is not None:
                    pending = on_level(level)
                    if pending is not None:
                        await pending
    return results
