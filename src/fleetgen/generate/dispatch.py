"""Dispatch work to every ready endpoint: least-outstanding requests (`choose.LeastLoaded`), a per-endpoint
cap, no head-of-line blocking (each request is its own task; a slow one holds only its own slot).

Failure policy:
- a retryable failure (connection, timeout, 408/409/425/429/5xx) is retried with exponential backoff and
  jitter, up to `max_retries`, on whichever endpoint is least loaded then; other 4xx → an error row, unless
  requests sent in a row are all refused alike (by send order, not arrival: rejects.py): then the request is
  wrong, not a record, and the job stops with RequestRejected before the dataset is burned into error rows;
- an endpoint whose connection fails (or that fails `drain_after` times in a row) is drained: no new work,
  its in-flight requests are cancelled and re-queued elsewhere (not counted as attempts); the `HealthMonitor`
  (health.py) probes it and it is used again once healthy, like endpoints not ready when the job started;
  `on_dead` (the `--restart-dead` hook) restarts a dead one in the background;
- `max_consecutive_failures` failures in a row fleet-wide, or no ready endpoint for `dead_timeout_s`, ends
  the job with `FleetDown`: the servers are gone, so the dataset is not burned into error rows.

`in_flight_for`: a server's default requests in flight, from the running requests its engine admits plus
a queue (`run` without `concurrency`, and `tune`); where that figure is a floor, `fill` raises the cap from
the engine's own running and waiting counts until it queues some. The fleet-down clock is the
`HealthMonitor`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from fleetgen.deploy.readiness import Readiness
from fleetgen.errors import FleetDown, FleetgenError
from fleetgen.generate.choose import LeastLoaded
from fleetgen.generate.health import Endpoint, HealthMonitor, states
from fleetgen.generate.rejects import Refusal, Streak
from fleetgen.generate.work import Work
from fleetgen.http.client import RequestFailed

# In flight per server: the running requests its engine admits, and a queue beside them so that a finished
# request is replaced at once (SGLang's guide: keep requests waiting), not so deep that requests wait long.
QUEUE_FACTOR = 1.3
QUEUE_EXTRA = 4


# A server whose engine's figure is a floor (vLLM's concurrency at max-model-len) starts at it and is filled:
# its cap rises by this share while the engine runs all it is sent, up to `in_flight_for(FILL_CEILING)`.
FILL_STEP = 0.25
FILL_CEILING = 4096


def in_flight_for(admitted: int) -> int:
    """The requests to keep in flight on a server whose engine admits `admitted` running ones."""
    return math.ceil(admitted * QUEUE_FACTOR) + QUEUE_EXTRA


def refilled(cap: int, in_flight: int, running: int, waiting: int) -> int:
    """A filled server's next cap: while the job holds it at its cap and the engine queues fewer of them than
    `in_flight_for` keeps beside the batch it runs (it could run more), a quarter more, up to the ceiling;
    else as it is. Never lowered: an engine that stops admitting queues the rest, which costs nothing."""
    ceiling = in_flight_for(FILL_CEILING)
    if in_flight < cap or waiting >= in_flight_for(running) - running or cap >= ceiling:
        return cap
    return min(ceiling, max(cap + QUEUE_EXTRA, math.ceil(cap * (1 + FILL_STEP))))


OnSuccess = Callable[[str, Work, float, float], None]  # endpoint, work, started_at (epoch), latency_s
OnError = Callable[[str, Work, RequestFailed], None]  # endpoint, work, the final failure
BodyFor = Callable[[Work], dict[str, Any]]


class Dispatcher:
    """Runs `Work` items from an iterator across `endpoints`; results and final errors go to callbacks."""

    def __init__(
        self, monitor: HealthMonitor, body_for: BodyFor, on_success: OnSuccess, on_error: OnError
    ) -> None:
        # The HealthMonitor was started before the model was known (the first ready endpoint names it).
        self._monitor = monitor
        self.endpoints = monitor.endpoints
        self.policy = policy = monitor.policy
        self._body_for = body_for
        self._on_success = on_success
        self._on_error = on_error
        self._retries: deque[Work] = deque()
        self.num_in_flight = 0
        self._changed = asyncio.Event()
        self._drained: set[asyncio.Task[None]] = set()
        self._least_loaded = LeastLoaded(self.endpoints)
        monitor.on_ready = self._readied
        monitor.on_hung = self._hung
        self._timers: set[asyncio.TimerHandle] = set()
        self._stopping = False
        self._fatal: FleetgenError | None = None
        self._refused = Streak(policy.max_identical_rejections)
        self._num_succeeded = 0
        self.failures_in_row = 0
        self.last_error = ""

    @property
    def num_retrying(self) -> int:
        return len(self._timers) + len(self._retries)

    @property
    def wait_left_s(self) -> float | None:
        """With no endpoint ready: the seconds left before the job stops with FleetDown; None while one is."""
        return self._monitor.wait_left_s(self.policy.dead_timeout_s)

    def fill(self, endpoint: Endpoint, running: int, waiting: int) -> None:
        """Raise a filled endpoint's cap (`refilled`) from its engine's running and waiting requests now."""
        cap = refilled(endpoint.cap, endpoint.in_flight, running, waiting)
        if cap > endpoint.cap:
            endpoint.cap = cap
            self._least_loaded.moved(endpoint)
            self._changed.set()

    def stop(self) -> None:
        """Stop taking new work (Ctrl-C); in-flight requests go on until `drain` or `abandon`."""
        self._stopping = True
        self._changed.set()

    async def run(self, items: Iterator[Work]) -> None:
        """Dispatch until the items and retries are done, `stop()` is called, or the fleet is down."""
        exhausted = False
        while True:
            self._changed.clear()
            if self._fatal is not None:
                raise self._fatal
            if self._stopping:
                return
            target = self._pick()
            if target is None:
                await self._wait_for_endpoint()
                continue
            work = self._retries.popleft() if self._retries else None
            if work is None and not exhausted:
                work = next(items, None)
                exhausted = work is None
            if work is None:
                if self.num_in_flight == 0 and not self._timers:
                    self._end_refusals()
                    return
                await self._changed.wait()
                continue
            self._launch(target, work)

    async def drain(self) -> None:
        """Wait for every in-flight request to finish (graceful stop)."""
        while self.num_in_flight:
            self._changed.clear()
            await self._changed.wait()

    async def abandon(self) -> None:
        """Cancel every in-flight request (nothing of theirs is written), retry timers, probes, restarts."""
        tasks = [task for endpoint in self.endpoints for task in endpoint.tasks]
        cancelled: list[asyncio.Task[None] | asyncio.TimerHandle] = [*tasks, *self._timers]
        for each in cancelled:
            each.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._monitor.close()

    def _pick(self) -> Endpoint | None:
        return self._least_loaded.pick()

    def _readied(self) -> None:
        self._least_loaded.rebuild()  # an endpoint is READY again
        self._changed.set()

    async def _wait_for_endpoint(self) -> None:
        left = self.wait_left_s
        if left == 0.0:
            raise self._fleet_down(f"no endpoint has been healthy for {self.policy.dead_timeout_s:.0f} s")
        with contextlib.suppress(TimeoutError):  # with none ready: wake up when the wait runs out
            await asyncio.wait_for(self._changed.wait(), left)

    def _launch(self, endpoint: Endpoint, work: Work) -> None:
        if work.number < 0:  # its first send; a retry is the same request, not judged by a server yet
            work.number = self._refused.sent()
        if not endpoint.in_flight:
            endpoint.progress_at = time.monotonic()  # silence is counted from here
        endpoint.in_flight += 1
        self.num_in_flight += 1
        self._least_loaded.moved(endpoint)
        task = asyncio.get_running_loop().create_task(self._serve(endpoint, work))
        endpoint.tasks.add(task)
        # Its end is counted by a callback, not the coroutine's `finally`: a task cancelled before its first
        # step (drained in the loop turn that launched it) runs none of its body.
        task.add_done_callback(functools.partial(self._served, endpoint, work))

    async def _serve(self, endpoint: Endpoint, work: Work) -> None:
        started, t0 = time.time(), time.monotonic()
        try:
            while not work.is_finished:
                work.done.append(await endpoint.client.chat(self._body_for(work)))
        except RequestFailed as exc:
            self._failed(endpoint, work, exc)
        else:
            endpoint.num_failures_in_row = 0
            self.failures_in_row = 0
            self._num_succeeded += 1
            self._write_errors(self._refused.ended(work.number))
            endpoint.completions += 1
            endpoint.output_tokens += sum(c.completion_tokens or 0 for c in work.done)
            self._on_success(endpoint.name, work, started, time.monotonic() - t0)

    def _served(self, endpoint: Endpoint, work: Work, task: asyncio.Task[None]) -> None:
        endpoint.progress_at = time.monotonic()  # an answer (or a failure): not silent
        endpoint.in_flight -= 1
        endpoint.tasks.discard(task)
        self.num_in_flight -= 1
        self._least_loaded.moved(endpoint)
        if task in self._drained:  # its endpoint was drained: the work goes elsewhere, not its fault
            self._drained.discard(task)
            if task.cancelled():
                self._retries.append(work)
        self._changed.set()

    def _failed(self, endpoint: Endpoint, work: Work, exc: RequestFailed) -> None:
        self.last_error = f"{endpoint.name}: {exc.message}"
        endpoint.last_error = exc.message
        if not exc.is_retryable:  # the server is alive and refuses this request: held, see rejects.py
            self._write_errors(self._refused.refused(work.number, (endpoint.name, work, exc)))
            if self._refused.is_the_jobs:
                self._fatal = self._refused.error(self._body_for)
            return
        if exc.status != 429:  # 429 is backpressure: the server is alive and asks us to slow down
            self.failures_in_row += 1
            endpoint.num_failures_in_row += 1
            if exc.is_connection or endpoint.num_failures_in_row >= self.policy.drain_after:
                self._mark_down(endpoint)
        work.attempts += 1
        if work.attempts > self.policy.max_retries:
            self._on_error(endpoint.name, work, exc)
            self._write_errors(self._refused.ended(work.number))
        else:
            self._retry_later(work)
        if self.failures_in_row >= self.policy.max_consecutive_failures:
            self._fatal = self._fleet_down(f"{self.failures_in_row} requests failed in a row")

    def _end_refusals(self) -> None:
        """The work is done: refusals still held are error rows, unless nothing at all succeeded this run
        and they are one refusal repeated (a small job whose every request is wrong: RequestRejected)."""
        if self._num_succeeded == 0 and self._refused.is_one_repeated:
            raise self._refused.error(self._body_for)
        self._write_errors(self._refused.release())

    def _write_errors(self, refusals: list[Refusal]) -> None:
        """Refusals shown to be the records' own (rejects.py): each becomes its error row."""
        for refusal in refusals:
            self._on_error(*refusal)

    def _retry_later(self, work: Work) -> None:
        def ready() -> None:
            self._timers.discard(handle)
            self._retries.append(work)
            self._changed.set()

        ceiling = min(self.policy.backoff_max_s, self.policy.backoff_base_s * 2.0 ** (work.attempts - 1))
        delay = ceiling * random.uniform(0.5, 1.0)  # jitter: retries of one burst do not arrive together
        handle = asyncio.get_running_loop().call_later(delay, ready)
        self._timers.add(handle)

    def _hung(self, endpoint: Endpoint, why: str) -> None:
        endpoint.last_error = why
        self.last_error = f"{endpoint.name}: {why}"
        self._mark_down(endpoint)
        self._changed.set()

    def _mark_down(self, endpoint: Endpoint) -> None:
        if endpoint.readiness is not Readiness.READY:
            return
        current = asyncio.current_task()
        for task in list(endpoint.tasks):
            if task is not current:
                self._drained.add(task)
                task.cancel()
        self._monitor.lost(endpoint)

    def _fleet_down(self, why: str) -> FleetDown:
        return FleetDown(
            f"stopping the job: {why}; the servers look gone",
            context={"endpoints": states(self.endpoints, "no error"), "last error": self.last_error},
            fix="check the servers (`fleetgen status`), bring them back (`fleetgen up`), then rerun the same "
            "command: it resumes, and `--retry-errors` re-runs rows that failed meanwhile",
        )
