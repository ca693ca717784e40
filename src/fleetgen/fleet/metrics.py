"""An engine's load from its /metrics (and SGLang's /server_info): running, queued, tok/s, accept length.

SGLang exports gauges (`sglang:gen_throughput`, `sglang:spec_accept_length`); vLLM only counters, so its
generation throughput is the rate of `vllm:generation_tokens_total` between two scrapes and its accept
length is 1 + accepted / drafts. Pure functions over parsed samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgen.deploy.probe import accept_length, internal_states
from fleetgen.engines.base import MetricNames


@dataclass(frozen=True)
class Scrape:
    """One /metrics read: parsed samples (summed over labels) and when (monotonic seconds)."""

    at: float
    samples: Mapping[str, float]


@dataclass(frozen=True)
class Load:
    """What an engine is doing right now."""

    running: int | None
    queued: int | None
    gen_tokens_per_s: float | None
    spec_accept_length: float | None


def counter_rate(name: str, now: Scrape, before: Scrape | None) -> float | None:
    """Per-second increase of a counter between two scrapes; None without two usable scrapes.

    A counter that went down means the engine restarted: the rate is unknown, not negative.
    """
    if before is None or not name or name not in now.samples or name not in before.samples:
        return None
    elapsed = now.at - before.at
    delta = now.samples[name] - before.samples[name]
    if elapsed <= 0 or delta < 0:
        return None
    return delta / elapsed


def load_from(names: MetricNames, now: Scrape, before: Scrape | None = None, info: Any = None) -> Load:
    """Running/queued from gauges; throughput from the gauge (SGLang) or the counter rate (vLLM)."""
    running = now.samples.get(names.running)
    queued = now.samples.get(names.queued)
    tps: float | None = None
    if names.gen_throughput and names.gen_throughput in now.samples:
        tps = now.samples[names.gen_throughput]
    else:
        tps = counter_rate(names.generation_tokens_total, now, before)
    return Load(
        running=int(running) if running is not None else None,
        queued=int(queued) if queued is not None else None,
        gen_tokens_per_s=tps,
        spec_accept_length=accept_length(names, now.samples, info),
    )


def max_running_from_info(info: Any) -> int | None:
    """The concurrency the engine settled on (SGLang: effective per-DP value, else the server arg)."""
    for state in internal_states(info):
        value = state.get("effective_max_running_requests_per_dp") or state.get("max_running_requests")
        if isinstance(value, int) and value > 0:
            return value
    if isinstance(info, dict) and isinstance(info.get("max_running_requests"), int):
        return int(info["max_running_requests"])
    return None


def max_running_from_capacity(capacity: Mapping[str, float], max_num_seqs: str | None = None) -> int | None:
    """vLLM's "maximum concurrency" at max-model-len (`kv_cache_max_concurrency`), capped by max-num-seqs.

    A floor, not a ceiling: shorter requests let vLLM run more at once; fleetgen plans for full-length ones.
    """
    value = capacity.get("max_running_requests")
    if not value or value < 1:
        return None
    cap = int(max_num_seqs) if max_num_seqs and max_num_seqs.isdigit() else None
    return min(int(value), cap) if cap else int(value)
