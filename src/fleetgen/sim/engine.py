"""The simulated scheduler: one loop of prefill and decode steps over a batch, as SGLang's event loop runs.

Each choice of a request is one sequence (n choices are n running requests, as in SGLang). Arrivals wait in
a FIFO queue; at each turn the loop either admits a prefill batch (while running < max running requests,
the KV budget holds its prompts plus the reserve SGLang keeps for running requests' future tokens, and the
batch's prompts stay within `--max-prefill-tokens`) or runs one decode step of everything running. Before a
decode step that would not find a free KV slot per request (per draft token with speculative decoding),
requests are retracted as SGLang's `retract_decode` does (fewest output tokens first, then longest prompt),
back to the front of the queue with their output kept, and the "KV cache pool is full. Retract requests."
warning is logged.

Step times come from the `stepmodel` pace: the roofline (`--sim-bandwidth-gbs`: time depends on the batch
and the bytes it reads) or the fixed `--sim-decode-tps` (each step `1/decode_tps`, prefill free; 0 decodes
a whole answer in one step, instantly). Simulated time runs `--sim-time-scale` times faster than the wall
clock: steps are computed back to back and the loop sleeps whenever it is ahead of the wall clock by a pace
tick, so rates seen from outside are `time_scale ×` the simulated GPU's.

A decode step commits one token per request, or the accept length with speculative decoding (fractional
lengths carried as credit from step to step, so the mean is exact), which is `SGLANG_SIMULATE_ACC_LEN` when
set (SGLang's forced acceptance) else `--sim-accept-length`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import AsyncIterator

from fleetgen.sim.counters import Counters, LogShape, decode_log_line
from fleetgen.sim.stepmodel import FixedPace, Pace, Roofline

logger = logging.getLogger("sglang.srt.managers.scheduler")

DECODE_LOG_PERIOD_S = 1.0  # SGLang logs every decode_log_interval (40) steps: about once a second under load
PACE_STEP_S = 0.02  # the loop sleeps once it is this far ahead of the wall clock
MAX_LAG_S = 0.5  # further behind than this (a busy CPU), the simulated clock stops trying to catch up
YIELD_EVERY = 32  # steps computed without sleeping before the loop lets the HTTP handlers run anyway
# SGLang's environment defaults (`environ.py`): the admission's reserve for running requests' future tokens
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
OOM_ABORT = (
    "Out of memory even after retracting all other requests in the decode batch. Aborting the last request."
)


@dataclasses.dataclass(eq=False)
class Progress:
    """One request's sequences as its handler sees them; `changed` is set when any of them moved."""

    streaming: bool
    seqs: list[Seq] = dataclasses.field(default_factory=list)
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    aborted: str | None = None  # SGLang's abort message (HTTP 500), when the pool could not hold it

    async def updates(self) -> AsyncIterator[list[int]]:
        """Each sequence's generated count, whenever some moved, until all are finished."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            yield [seq.generated for seq in self.seqs]
            if all(seq.is_finished for seq in self.seqs):
                return


@dataclasses.dataclass(eq=False)
class Seq:
    """One sequence in the scheduler: its prompt, the length it will reach, and how far it got."""

    progress: Progress
    prompt_tokens: int
    target_tokens: int
    max_new_tokens: int  # what admission reserves against (max_tokens, else the context left)
    generated: int = 0
    credit: float = 0.0  # accepted tokens carried to the next step (fractional accept lengths)

    @property
    def context(self) -> int:
        """Tokens it holds in the KV cache while running."""
        return self.prompt_tokens + self.generated

    @property
    def is_finished(self) -> bool:
        """It produced all its tokens (or was aborted)."""
        return self.generated >= self.target_tokens

    def reserve(self, ratio: float) -> float:
        """The KV tokens admission keeps for its future output (SGLang's PrefillAdder estimate)."""
        return min(self.max_new_tokens - self.generated, CLIP_MAX_NEW_TOKENS) * ratio


class SimScheduler:
    """One simulated scheduler (DP=1). Coroutines only; no threads."""

    def __init__(
        self,
        *,
        max_running: int,
        max_total_tokens: int,
        pace: Pace,
        spec_draft_tokens: int,
        accept_length: float,
        crash_after: int | None,
        hybrid: bool,
        mamba_cache_size: int,
        time_scale: float = 1.0,
        max_prefill_tokens: int = 16384,
    ) -> None:
        self.max_running = max(1, max_running)
        self.max_total_tokens = max_total_tokens
        self.pace = pace
        self.time_scale = time_scale if time_scale > 0 else 1.0
        self.max_prefill_tokens = max_prefill_tokens
        self.spec_draft_tokens = spec_draft_tokens  # 0 = no speculative decoding
        self.accept_length = min(max(1.0, accept_length), float(max(1, spec_draft_tokens)))
        self.crash_after = crash_after
        self.hybrid = hybrid
        self.mamba_cache_size = mamba_cache_size
        self.counters = Counters()
        self._waiting: collections.deque[Seq] = collections.deque()
        self._running: list[Seq] = []
        self._used = 0  # KV tokens the running sequences hold
        self._work = asyncio.Event()
        self._touched: set[Progress] = set()
        self._new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._due = time.monotonic()  # the wall time the simulated clock has reached
        self._unyielded = 0
        self._arrivals = 0

    @property
    def is_spec(self) -> bool:
        """Speculative decoding is running (and reported)."""
        return self.spec_draft_tokens > 0

    @property
    def is_instant(self) -> bool:
        """`--sim-decode-tps 0` without a roofline: a whole answer in one step, no time passes."""
        return isinstance(self.pace, FixedPace) and self.pace.is_instant

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
    async def running(
        self, prompt_tokens: int, lengths: list[int], max_new_tokens: int, streaming: bool
    ) -> AsyncIterator[Progress]:
        """Queue one request's sequences (one per choice, `lengths` tokens each) and follow them; leaving
        early (a client gone) drops them from the queue or the batch, as SGLang aborts a request."""
        started = time.monotonic()
        progress = Progress(streaming)
        progress.seqs = [Seq(progress, prompt_tokens, n, max(n, max_new_tokens)) for n in lengths]
        self.counters.prompt_tokens[streaming] += prompt_tokens
        self._waiting.extend(progress.seqs)
        self._sync_gauges()
        self._work.set()
        try:
            yield progress
        finally:
            self._drop(progress.seqs)
            self.counters.num_requests[streaming] += 1
            self.counters.observe_e2e(time.monotonic() - started)

    def _drop(self, seqs: list[Seq]) -> None:
        for seq in seqs:
            if seq.is_finished:  # already out of the batch (finished, or aborted)
                continue
            if seq in self._running:
                self._running.remove(seq)
                self._used -= seq.context
            elif seq in self._waiting:
                self._waiting.remove(seq)
        self._sync_gauges()

    def _sync_gauges(self) -> None:
        counters = self.counters
        counters.num_running, counters.num_queued = len(self._running), len(self._waiting)
        counters.used_tokens = self._used

    async def run(self) -> None:
        """The scheduler's event loop, for the server's life: a prefill or a decode step per turn."""
        while True:
            if not self._running and not self._waiting:
                self._notify()
                self._work.clear()
                await self._work.wait()
                self._due = time.monotonic()
            await self._keep_pace(self.step())

    def step(self) -> float:
        """One turn: admit and prefill a batch if one fits, else decode everything running once.
        Returns the simulated seconds it took."""
        seconds = self._turn()
        self._sync_gauges()
        return seconds

    def _turn(self) -> float:
        admitted = self._admit()
        if admitted:
            seconds = self.pace.prefill_seconds(len(admitted), sum(s.context for s in admitted))
            if isinstance(self.pace, Roofline):  # a prefill yields each request's next token
                for seq in admitted:
                    self._commit(seq, min(1, seq.target_tokens - seq.generated), spec=False)
            self._finish()
            return seconds
        if not self._running:
            return 0.0
        self._retract()
        seconds = self.pace.decode_seconds(len(self._running), self._used)
        accept = self.accept_length if self.is_spec else 1.0
        for seq in self._running:
            if self.is_instant:
                tokens = seq.target_tokens - seq.generated
            else:
                seq.credit += accept
                tokens = min(int(seq.credit), seq.target_tokens - seq.generated)
                seq.credit -= int(seq.credit)
            self._commit(seq, tokens, spec=True)
        self._new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self._new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        self._finish()
        return seconds

    def _admit(self) -> list[Seq]:
        """Move queued sequences into the batch while the cap, the KV budget and the prefill size allow."""
        free = self.max_total_tokens - self._used
        budget = free - sum(seq.reserve(self._new_token_ratio) for seq in self._running)
        admitted: list[Seq] = []
        prefill = 0
        while self._waiting and len(self._running) < self.max_running:
            seq = self._waiting[0]
            need = seq.context + seq.reserve(self._new_token_ratio)
            if self._running and (need > budget or prefill + seq.context > self.max_prefill_tokens):
                break
            if seq.context > free:  # not even an empty batch holds it
                if not self._running:
                    self._waiting.popleft()
                    self._abort(seq)
                break
            self._waiting.popleft()
            self._running.append(seq)
            self._used += seq.context
            free -= seq.context
            budget -= need
            prefill += seq.context
            admitted.append(seq)
        return admitted

    def _retract(self) -> None:
        """Free KV for this decode step's tokens by sending requests back to the queue (`retract_decode`)."""
        per_request = self.spec_draft_tokens if self.is_spec else 1
        if self.is_instant or self.max_total_tokens - self._used >= per_request * len(self._running):
            return
        old_ratio, before, retracted = self._new_token_ratio, self._used, 0
        keep = sorted(self._running, key=lambda s: (s.generated, -s.prompt_tokens), reverse=True)
        while self.max_total_tokens - self._used < per_request * len(keep):
            victim = keep.pop()
            self._used -= victim.context
            if not keep:  # alone and still too big: SGLang aborts it
                self._abort(victim)
                break
            self._waiting.appendleft(victim)
            retracted += 1
        self._running = [seq for seq in self._running if seq in keep]
        decoded = sum(seq.generated for seq in keep)
        max_new = sum(seq.max_new_tokens for seq in keep)
        self._new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(keep)) / (max_new + 1))
        details = f"#retracted_reqs: {retracted}, #new_tokens_gained: {before - self._used}"
        if self.hybrid:
            details += f", #mamba_num_gained: {retracted}"
        details += f", #new_token_ratio: {old_ratio:.4f} -> {self._new_token_ratio:.4f}"
        logger.warning("KV cache pool is full. Retract requests. " + details)

    def _abort(self, seq: Seq) -> None:
        seq.progress.aborted = OOM_ABORT
        seq.target_tokens = seq.generated
        self._touched.add(seq.progress)

    def _commit(self, seq: Seq, tokens: int, spec: bool) -> None:
        seq.generated += tokens
        self._used += tokens
        accept = self.accept_length if spec and self.is_spec else None
        self.counters.generated(tokens, seq.progress.streaming, accept)
        self._touched.add(seq.progress)

    def _finish(self) -> None:
        """Finished sequences leave the batch at the step that finished them, freeing their KV and slot."""
        kept: list[Seq] = []
        for seq in self._running:
            if seq.is_finished:
                self._used -= seq.context
                self._touched.add(seq.progress)
            else:
                kept.append(seq)
        self._running = kept

    def _notify(self) -> None:
        for progress in self._touched:
            progress.changed.set()
        self._touched.clear()
        self._unyielded = 0

    async def _keep_pace(self, seconds: float) -> None:
        """Advance the simulated clock; sleep while it is ahead of the wall clock by a tick."""
        self._due += seconds / self.time_scale
        lag = self._due - time.monotonic()
        if lag >= PACE_STEP_S:
            self._notify()
            await asyncio.sleep(lag)
            return
        if lag < -MAX_LAG_S:
            self._due = time.monotonic()
        self._unyielded += 1
        if seconds == 0 or self._unyielded >= YIELD_EVERY:
            self._notify()
            await asyncio.sleep(0)

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
        shape = LogShape(
            self.hybrid,
            self.mamba_cache_size,
            self.max_total_tokens,
            self.spec_draft_tokens,
            self.accept_length,
        )
        return decode_log_line(self.counters, shape)

    async def log_loop(self) -> None:
        """Print the decode line about once a second while there is load."""
        while True:
            await asyncio.sleep(DECODE_LOG_PERIOD_S)
            line = self.decode_log_line()
            if line is not None:
                logger.info(line)
