"""`/metrics` in Prometheus text format, with SGLang 0.5.23's metric names and labels.

Names and label sets follow `observability/metrics_collector.py`: scheduler gauges carry
`model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`; tokenizer counters carry
`model_name, engine_type` (+ `is_streaming`). Only the series fleetgen reads are simulated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from fleetgen.sim.counters import E2E_BUCKETS
from fleetgen.sim.engine import SimScheduler


def _labels(pairs: Mapping[str, object]) -> str:
    inner = ",".join(f'{key}="{value}"' for key, value in pairs.items())
    return "{" + inner + "}"


def _family(
    lines: list[str], name: str, kind: str, doc: str, samples: Sequence[tuple[str, str, float]]
) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} {kind}")
    for suffix, labels, value in samples:
        lines.append(f"{name}{suffix}{labels} {float(value)!r}")


def _gauges(sched: SimScheduler, labels: str, max_total_tokens: int) -> list[tuple[str, str, float]]:
    counters = sched.counters
    gauges: list[tuple[str, str, float]] = [
        ("sglang:num_running_reqs", "The number of running requests.", counters.num_running),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", counters.num_queued),
        ("sglang:gen_throughput", "The generation throughput (token/s).", counters.last_gen_throughput),
        ("sglang:token_usage", "The token usage.", round(sched.token_usage, 2)),
        ("sglang:num_used_tokens", "The number of used tokens.", counters.used_tokens),
        ("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0),
        (
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            max_total_tokens,
        ),
    ]
    if sched.hybrid:
        usage = counters.num_running / max(1, sched.mamba_cache_size)
        gauges.append(("sglang:mamba_usage", "The token usage for Mamba layers.", round(usage, 2)))
    # exported with or without speculation (0.0 until a "Decode batch" line with spec), as real SGLang does
    rate = (counters.last_accept_length - 1) / max(1, sched.spec_draft_tokens - 1)
    gauges += [
        (
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            counters.last_accept_length,
        ),
        (
            "sglang:spec_accept_rate",
            "The average acceptance rate of speculative decoding.",
            max(0.0, rate) if counters.last_accept_length else 0.0,
        ),
    ]
    return [(name, doc, value) for name, doc, value in gauges]


def render_metrics(sched: SimScheduler, model_name: str, max_total_tokens: int) -> str:
    """The whole exposition text."""
    base = {"model_name": model_name, "engine_type": "unified"}
    sched_labels = _labels({**base, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0})
    lines: list[str] = []
    for name, doc, value in _gauges(sched, sched_labels, max_total_tokens):
        _family(lines, name, "gauge", doc, [("", sched_labels, value)])
    counters = sched.counters
    for name, doc, per_stream in (
        ("sglang:prompt_tokens", "Number of prefill tokens processed.", counters.prompt_tokens),
        ("sglang:generation_tokens", "Number of generation tokens processed.", counters.generation_tokens),
        ("sglang:num_requests", "Number of requests processed.", counters.num_requests),
    ):
        samples = [
            ("_total", _labels({**base, "is_streaming": str(is_streaming)}), count)
            for is_streaming, count in per_stream.items()
        ]
        _family(lines, name, "counter", doc, samples)
    if sched.is_spec:
        verify = [("_total", _labels(base), float(math.ceil(counters.spec_verify_steps)))]
        _family(lines, "sglang:spec_verify_calls", "counter", "Number of speculative verify calls.", verify)
    buckets: list[tuple[str, str, float]] = []
    cumulative = 0
    for bound, count in zip(E2E_BUCKETS, counters.e2e_buckets, strict=True):
        cumulative += count
        le = "+Inf" if math.isinf(bound) else repr(bound)
        buckets.append(("_bucket", _labels({**base, "le": le}), cumulative))
    buckets += [("_count", _labels(base), cumulative), ("_sum", _labels(base), counters.e2e_sum)]
    _family(
        lines,
        "sglang:e2e_request_latency_seconds",
        "histogram",
        "Histogram of End-to-end request latency in seconds",
        buckets,
    )
    return "\n".join(lines) + "\n"
