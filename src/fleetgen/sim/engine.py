"""The simulated scheduler: admission up to max_running_requests (the rest queue), decode pacing, counters,
speculative accept statistics, the periodic "Decode batch" log line, and the hard crash knob.

Decode pacing: `--sim-decode-tps` is the decode steps per second one request gets (= its tokens/s without
speculative decoding). With speculative decoding on, one step (draft + verify) yields `accept_length`
tokens on average (the bonus token included, as SGLang counts it), so a request decodes at
`decode_tps × accept_length` tokens/s. The sim charges nothing for the draft model's own passes, so its
speed-up equals the accept length: an upper bound of what a GPU gets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import math
import os
import signal
import time
from collections.abc import AsyncIterator

logger = logging.getLogger("sglang.srt.managers.scheduler")

DECODE_LOG_PERIOD_S = 1.0  # SGLang logs every decode_log_interval (40) steps: about once a second under load
PACE_STEP_S = 0.02
E2E_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    math.inf,
)  # with --sim-decode-tps > 0, tokens are released in steps of at least this long


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
    # SGLang's MetricsReporter: per-period accept counts, moved into the totals only when a "Decode batch"
    # line is logged (so `avg_spec_accept_length` and the accept-length gauge exist only after one), while
    # the verify-call counter moves on every step (`sglang:spec_verify_calls_total`).
    spec_accept_tokens: int = 0
    spec_forward_ct: float = 0.0  # steps = tokens / accept length (fractional: tokens arrive in chunks)
    spec_total_accept_tokens: int = 0
    spec_total_forward_ct: float = 0.0
    spec_verify_steps: float = 0.0  # every step, at once; the counter exported is its ceiling
    last_gen_throughput: float = 0.0
    last_accept_length: float = 0.0


class SimScheduler:
    """One simulated scheduler (DP=1). Coroutines only; no threads."""

    def __init__(
        self,
        *,
        max_running: int,
        max_total_tokens: int,
        decode_tps: float,
        spec_draft_tokens: int,
        accept_length: float,
        crash_after: int | None,
        hybrid: bool,
        mamba_cache_size: int,
    ) -> None:
        self.max_running = max(1, max_running)
        self.max_total_tokens = max_total_tokens
        self.decode_tps = decode_tps
        self.spec_draft_tokens = spec_draft_tokens  # 0 = no speculative decoding
        self.accept_length = min(max(1.0, accept_length), float(max(1, spec_draft_tokens)))
        self.crash_after = crash_after
        self.hybrid = hybrid
        self.mamba_cache_size = mamba_cache_size
        self.counters = Counters()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._arrivals = 0
        self._tokens_since_log = 0
        self._last_log = time.monotonic()

    @property
    def is_spec(self) -> bool:
        """Speculative decoding is running (and reported)."""
        return self.spec_draft_tokens > 0

    def arrive(self) -> None:
        """Count an arriving request; past `--sim-crash-after` the process dies like after a CUDA crash."""
        self._arrivals += 1
        if self.crash_after is not None and self._arrivals > self.crash_after:
            logger.error(
                "Scheduler hit an exception: Traceback (most recent call last):\n"
                '  File "sglang/srt/managers/scheduler.py", line 6366, in run_scheduler_process\n'
                "    scheduler.run_event_loop()\n"
                "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, "
                "so the stacktrace "
                "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            )
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    @contextlib.asynccontextmanager
    async def running(self, prompt_tokens: int, streaming: bool) -> AsyncIterator[None]:
        """Hold a running slot for one request (queueing while max_running_requests are busy)."""
        counters = self.counters
        started = time.monotonic()
        await self._admit()
        counters.used_tokens += prompt_tokens
        counters.prompt_tokens[streaming] += prompt_tokens
        try:
            yield
        finally:
            counters.num_running -= 1
            counters.used_tokens -= prompt_tokens
            counters.num_requests[streaming] += 1
            self._observe_e2e(time.monotonic() - started)
            self._wake_next()

    def _observe_e2e(self, seconds: float) -> None:
        counters = self.counters
        counters.e2e_sum += seconds
        for i, bound in enumerate(E2E_BUCKETS):
            if seconds <= bound:
                counters.e2e_buckets[i] += 1
                return

    async def _admit(self) -> None:
        """Take a running slot now, or queue (FIFO) until `_wake_next` hands one over."""
        counters = self.counters
        if counters.num_running < self.max_running and not self._waiters:
            counters.num_running += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        counters.num_queued += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                counters.num_running -= 1  # the slot was handed over as we were cancelled: give it back
                self._wake_next()
            raise
        finally:
            counters.num_queued -= 1

    def _wake_next(self) -> None:
        """Hand free slots to queued requests, oldest first (the slot is counted as running at once)."""
        while self._waiters and self.counters.num_running < self.max_running:
            future = self._waiters.popleft()
            if not future.done():
                self.counters.num_running += 1
                future.set_result(None)

    def generated(self, num_tokens: int, streaming: bool) -> None:
        """Account tokens as decoded (throughput, counters, speculative forward passes)."""
        counters = self.counters
        counters.generation_tokens[streaming] += num_tokens
        self._tokens_since_log += num_tokens
        if self.is_spec and num_tokens:
            steps = num_tokens / self.accept_length
            counters.spec_accept_tokens += num_tokens
            counters.spec_forward_ct += steps
            counters.spec_verify_steps += steps

    @property
    def tokens_per_s(self) -> float:
        """One request's decode speed: steps/s × tokens per step (the accept length with spec on)."""
        return self.decode_tps * (self.accept_length if self.is_spec else 1.0)

    async def pace(self, num_tokens: int) -> AsyncIterator[int]:
        """Release `num_tokens` over time at `tokens_per_s` (all at once when `--sim-decode-tps` is 0)."""
        rate = self.tokens_per_s
        if rate <= 0:
            yield num_tokens
            return
        released, start = 0, time.monotonic()
        while released < num_tokens:
            await asyncio.sleep(max(PACE_STEP_S, 1 / rate))
            due = min(num_tokens, int((time.monotonic() - start) * rate))
            if due > released:
                yield due - released
                released = due

    @property
    def avg_spec_accept_length(self) -> float | None:
        """Mean accepted tokens per verify pass (bonus token included) over logged periods, once one was."""
        counters = self.counters
        if not self.is_spec or counters.spec_total_forward_ct == 0:
            return None
        return self.accept_length  # the same every step: the mean over the logged periods

    @property
    def token_usage(self) -> float:
        """Fraction of the KV pool in use."""
        return self.counters.used_tokens / max(1, self.max_total_tokens)

    def decode_log_line(self) -> str | None:
        """SGLang's "Decode batch" line for the last period, or None when nothing was decoded."""
        now = time.monotonic()
        elapsed, tokens = now - self._last_log, self._tokens_since_log
        self._last_log, self._tokens_since_log = now, 0
        counters = self.counters
        if tokens == 0 and counters.num_running == 0:
            return None
        counters.last_gen_throughput = tokens / max(elapsed, 1e-9)
        used = counters.used_tokens
        parts = [f"#running-req: {counters.num_running}"]
        if self.hybrid:
            mamba_used = counters.num_running
            parts += [f"#full token: {used}", f"full token usage: {self.token_usage:.2f}"]
            parts += [
                f"mamba num: {mamba_used}",
                f"mamba usage: {mamba_used / max(1, self.mamba_cache_size):.2f}",
            ]
        else:
            parts += [f"#token: {used}, token usage: {self.token_usage:.2f}"]
        if self.is_spec:
            accept = self.accept_length  # each step of the period accepted this many (bonus included)
            counters.last_accept_length = accept
            counters.spec_total_accept_tokens += counters.spec_accept_tokens
            counters.spec_total_forward_ct += counters.spec_forward_ct
            counters.spec_accept_tokens = counters.spec_forward_ct = 0
            rate = max(0.0, accept - 1) / max(1, self.spec_draft_tokens - 1)
            parts += [f"accept len: {accept:.2f}", f"accept rate: {rate:.2f}"]
        parts += [
            "cuda graph: True",
            f"gen throughput (token/s): {counters.last_gen_throughput:.2f}",
            f"#queue-req: {counters.num_queued}",
        ]
        return "Decode batch, " + ", ".join(parts)

    async def log_loop(self) -> None:
        """Print the decode line about once a second while there is load."""
        while True:
            await asyncio.sleep(DECODE_LOG_PERIOD_S)
            line = self.decode_log_line()
            if line is not None:
                logger.info(line)
