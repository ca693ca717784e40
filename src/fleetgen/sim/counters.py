"""The simulated scheduler's numbers: Prometheus counters and gauges, and SGLang's "Decode batch" log line.

Speculative statistics follow SGLang's MetricsReporter: accepted tokens and forward counts per request-step
accumulate per log period and move into the totals only when a "Decode batch" line is logged (so
`avg_spec_accept_length` and the accept-length gauge exist only after one), while the verify-call counter
(`sglang:spec_verify_calls_total`) moves at every step.
"""

from __future__ import annotations

import dataclasses
import math
import time

E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)


@dataclasses.dataclass
class Counters:
    """Monotonic totals (Prometheus counters) and live gauges."""

    prompt_tokens: dict[bool, int] = dataclasses.field(default_factory=lambda: {False: 0, True: 0})
    generation_tokens: dict[bool, int] = dataclasses.field(default_factory=lambda: {False: 0, True: 0})
    num_requests: dict[bool, int] = dataclasses.field(default_factory=lambda: {False: 0, True: 0})
    e2e_sum: float = 0.0
    e2e_buckets: list[int] = dataclasses.field(default_factory=lambda: [0] * len(E2E_BUCKETS))
    num_running: int = 0
    num_queued: int = 0
    used_tokens: int = 0
    spec_accept_tokens: int = 0
    spec_forward_ct: float = 0.0  # request-steps = tokens / accept length (fractional: a last short step)
    spec_total_accept_tokens: int = 0
    spec_total_forward_ct: float = 0.0
    spec_verify_steps: float = 0.0  # every step, at once; the counter exported is its ceiling
    last_gen_throughput: float = 0.0
    last_accept_length: float = 0.0
    tokens_since_log: int = 0
    last_log: float = dataclasses.field(default_factory=time.monotonic)

    def observe_e2e(self, seconds: float) -> None:
        """One finished request's end-to-end latency into the histogram."""
        self.e2e_sum += seconds
        for i, bound in enumerate(E2E_BUCKETS):
            if seconds <= bound:
                self.e2e_buckets[i] += 1
                return

    def generated(self, num_tokens: int, streaming: bool, accept_length: float | None) -> None:
        """Tokens committed; with speculative decoding (`accept_length` set), the request-steps they took."""
        self.generation_tokens[streaming] += num_tokens
        self.tokens_since_log += num_tokens
        if accept_length is not None and num_tokens:
            steps = num_tokens / accept_length
            self.spec_accept_tokens += num_tokens
            self.spec_forward_ct += steps
            self.spec_verify_steps += steps


@dataclasses.dataclass(frozen=True)
class LogShape:
    """What the "Decode batch" line shows besides the counters."""

    hybrid: bool
    mamba_cache_size: int
    max_total_tokens: int
    spec_draft_tokens: int  # 0 without speculative decoding
    accept_length: float


def decode_log_line(counters: Counters, shape: LogShape) -> str | None:
    """SGLang's "Decode batch" line for the period since the last one, or None when nothing was decoded;
    closes the period (gen throughput, spec totals)."""
    now = time.monotonic()
    elapsed, tokens = now - counters.last_log, counters.tokens_since_log
    counters.last_log, counters.tokens_since_log = now, 0
    if tokens == 0 and counters.num_running == 0:
        return None
    counters.last_gen_throughput = tokens / max(elapsed, 1e-9)
    used = counters.used_tokens
    usage = used / max(1, shape.max_total_tokens)
    parts = [f"#running-req: {counters.num_running}"]
    if shape.hybrid:
        mamba_used = counters.num_running
        parts += [f"#full token: {used}", f"full token usage: {usage:.2f}"]
        parts += [
            f"mamba num: {mamba_used}",
            f"mamba usage: {mamba_used / max(1, shape.mamba_cache_size):.2f}",
        ]
    else:
        parts += [f"#token: {used}, token usage: {usage:.2f}"]
    if shape.spec_draft_tokens:
        accept = shape.accept_length  # each step of the period accepted this many (bonus included)
        counters.last_accept_length = accept
        counters.spec_total_accept_tokens += counters.spec_accept_tokens
        counters.spec_total_forward_ct += counters.spec_forward_ct
        counters.spec_accept_tokens = 0
        counters.spec_forward_ct = 0.0
        rate = max(0.0, accept - 1) / max(1, shape.spec_draft_tokens - 1)
        parts += [f"accept len: {accept:.2f}", f"accept rate: {rate:.2f}"]
    parts += [
        "cuda graph: True",
        f"gen throughput (token/s): {counters.last_gen_throughput:.2f}",
        f"#queue-req: {counters.num_queued}",
    ]
    return "Decode batch, " + ", ".join(parts)
