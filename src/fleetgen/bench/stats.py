"""Statistics of `fleetgen bench`: the value types, percentiles, accept length, speedups (pure).

`fleetgen.bench.sweep` does the I/O (streaming requests, /metrics scrapes) and folds what it saw with
these functions; keeping them apart makes them testable without a server.

`BenchLoad` is what to send, sampled greedily or as `run` samples a job file (`--job`), its requests built
by `http.request`; `BenchTarget` is one instance or the whole fleet. Percentiles by `statistics.quantiles`.
"""

from __future__ import annotations

import math
import random
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetgen.engines import engine_of_metrics
from fleetgen.http.client import StreamEvent
from fleetgen.http.metrics import accept_length, counter_deltas
from fleetgen.http.request import GREEDY, REQUEST_FIELDS, ChatRequests, Sampling

DEFAULT_CONCURRENCIES = (1, 8, 32, 128, 512)
# Plain words; each is about one token for BPE tokenizers, and a seeded shuffle per request defeats prefix
# caching (like `vllm bench serve`'s random dataset) so every level measures real prefill.
_VOCAB = tuple(
    " ".join(
        [
            "time year people way day man thing woman life child world school state family student group",
            "country problem hand part place case week company system program question work government",
            "number night point home water room mother area money story fact month lot right study book",
            "eye job word business issue side kind head house service friend father power hour game line",
        ]
    ).split(" ")
)


@dataclass(frozen=True)
class BenchLoad:
    """What to send: lengths in tokens, the concurrency sweep (per instance), and the request budget."""

    input_len: int = 1024
    output_len: int = 1024
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES
    rounds: int = 2  # each level sends rounds × concurrency requests (at least min_requests)
    min_requests: int = 8
    model: str | None = None
    ignore_eos: bool = True  # exactly output_len tokens per request, as `vllm bench serve` does
    # How tokens are sampled, in every request (probe and warm-up too): greedy unless `fleetgen bench --job`
    # puts there the job's, as `fleetgen run` sends it; bench's lengths and stream stay its own.
    sampling: Sampling = GREEDY
    api_key: str | None = None
    timeout_s: float = 3600.0
    seed: int = 0
    # Before the first level, one unmeasured burst at the top level (this many output tokens each): a fresh
    # server compiles kernels on its first batched prefill (100 s for SGLang MTP on an H200), which would
    # otherwise land inside the first level. 0: no warm-up.
    warmup_tokens: int = 16

    def num_requests(self, concurrency: int, num_instances: int) -> int:
        return max(self.rounds * concurrency, self.min_requests) * num_instances

    def requests(self, model: str, max_tokens: int) -> ChatRequests:
        """Bench's requests of `max_tokens` tokens: streamed with usage in the last event, sampled as
        `sampling` says."""
        return ChatRequests(model, max_tokens, self.sampling, stream=True, ignore_eos=self.ignore_eos)

    def sampling_sent(self) -> dict[str, object]:
        """The sampling fields every request carries (what `--json` records): the sampling's, less the
        request fields bench sets itself."""
        return {k: v for k, v in self.sampling.fields().items() if k not in REQUEST_FIELDS}


@dataclass(frozen=True)
class BenchTarget:
    """What one sweep measures: one instance (one URL) or the whole fleet (all URLs at once)."""

    name: str
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float


@dataclass
class RequestSample:
    """One streamed request as the client saw it."""

    is_ok: bool = False
    ttft_s: float = 0.0
    itls: array[float] = field(default_factory=lambda: array("d"))
    num_chunks: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level of one target."""

    target: str
    num_instances: int
    concurrency: int  # per instance
    num_requests: int
    num_failed: int
    duration_s: float
    output_tokens: int
    mean_input_tokens: float
    output_tok_s: float
    requests_s: float
    ttft_s: Percentiles | None
    itl_s: Percentiles | None
    accept_length: float | None  # from the engine's /metrics; None without speculative decoding
    tokens_per_chunk: float | None  # seen in the stream: ≈ accept length only if every step is its own chunk
    first_error: str = ""


@dataclass(frozen=True)
class SpeedupRow:
    target: str
    concurrency: int
    off_tok_s: float
    on_tok_s: float
    speedup: float
    accept_length: float | None


def summarize(values: Sequence[float]) -> Percentiles | None:
    """p50/p90/p99 and mean of `values`; None when there are none. The percentiles interpolate linearly
    between the closest ranks (`statistics.quantiles`' "inclusive" method, numpy's default)."""
    if not values:
        return None
    # quantiles() needs two points (before Python 3.13); every percentile of one value is that value.
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return Percentiles(cuts[49], cuts[89], cuts[98], math.fsum(values) / len(values))


def capped_levels(requested: Sequence[int], cap: int | None) -> tuple[int, ...]:
    """The requested levels at or below `cap`; the cap itself joins when some level was above it."""
    wanted = sorted({c for c in requested if c >= 1})
    if cap is None:
        return tuple(wanted)
    kept = [c for c in wanted if c <= cap]
    if any(c > cap for c in wanted) and cap not in kept:
        kept.append(cap)
    return tuple(kept)


def pooled_accept_length(
    befores: Sequence[Mapping[str, float]], afters: Sequence[Mapping[str, float]]
) -> float | None:
    """Accept length of several endpoints benched together (a fleet target), from each one's own /metrics
    before and after the level (the engine recognised from its metric names).

    Gauges must not be summed across endpoints (two engines at 2.5 are not at 5.0): each endpoint's value is
    read alone, then pooled as total tokens / total verify steps, i.e. the harmonic mean weighted by the
    tokens each endpoint generated in the window (equal weights when an engine exports no token counter)."""
    pairs: list[tuple[float, float]] = []  # (accept length, generated tokens)
    for before, after in zip(befores, afters, strict=True):
        engine = engine_of_metrics(after)
        during = counter_deltas(before, after)
        value = accept_length(engine, after, before)
        if value is not None:
            pairs.append((value, during.get(engine.metrics.generation_tokens_total, 0.0)))
    if not pairs:
        return None
    weights = [w for _, w in pairs] if all(w > 0 for _, w in pairs) else [1.0] * len(pairs)
    return sum(weights) / sum(w / value for (value, _), w in zip(pairs, weights, strict=True))


def tokens_per_chunk(samples: Sequence[RequestSample]) -> float | None:
    """Tokens per token-bearing chunk: the accept length if the server sends one chunk per decode step (a
    client that reads late sees coalesced chunks, so this is a hint, not the engine's number)."""
    tokens = sum(s.output_tokens for s in samples if s.is_ok)
    chunks = sum(s.num_chunks for s in samples if s.is_ok)
    return tokens / chunks if chunks else None


def build_level(
    target: BenchTarget,
    concurrency: int,
    samples: Sequence[RequestSample],
    duration_s: float,
    accept_length: float | None,
) -> LevelResult:
    """Fold one level's samples into its result (pure)."""
    ok = [s for s in samples if s.is_ok]
    failed = [s for s in samples if not s.is_ok]
    out_tokens = sum(s.output_tokens for s in ok)
    return LevelResult(
        target=target.name,
        num_instances=len(target.urls),
        concurrency=concurrency,
        num_requests=len(samples),
        num_failed=len(failed),
        duration_s=duration_s,
        output_tokens=out_tokens,
        mean_input_tokens=(sum(s.prompt_tokens for s in ok) / len(ok)) if ok else 0.0,
        output_tok_s=out_tokens / duration_s if duration_s > 0 else 0.0,
        requests_s=len(ok) / duration_s if duration_s > 0 else 0.0,
        ttft_s=summarize([s.ttft_s for s in ok]),
        itl_s=summarize([itl for s in ok for itl in s.itls]),
        accept_length=accept_length,
        tokens_per_chunk=tokens_per_chunk(samples),
        first_error=failed[0].error if failed else "",
    )


def speedups(off: Sequence[LevelResult], on: Sequence[LevelResult]) -> list[SpeedupRow]:
    """Pair levels of the spec-off and spec-on sweeps by (target, concurrency): on/off output tok/s."""
    by_key = {(r.target, r.concurrency): r for r in off}
    rows = []
    for r in on:
        base = by_key.get((r.target, r.concurrency))
        if base is not None:
            ratio = r.output_tok_s / base.output_tok_s if base.output_tok_s > 0 else 0.0
            rows.append(
                SpeedupRow(r.target, r.concurrency, base.output_tok_s, r.output_tok_s, ratio, r.accept_length)
            )
    return rows


def make_prompt(num_words: int, rng: random.Random) -> str:
    return " ".join(rng.choices(_VOCAB, k=max(1, num_words)))


def read_event(sample: RequestSample, event: StreamEvent, now: float, start: float, last: float) -> float:
    """Account one streamed event; return the time of the latest token-bearing chunk."""
    if event.has_text:
        if sample.num_chunks == 0:
            sample.ttft_s = now - start
        else:
            sample.itls.append(now - last)
        sample.num_chunks += 1
        last = now
    if event.completion_tokens is not None:
        sample.output_tokens = event.completion_tokens
        sample.prompt_tokens = event.prompt_tokens or 0
    return last
