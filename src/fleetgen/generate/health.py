"""Which servers of a job may take work, and bringing the others (back) in.

An endpoint's `readiness` (the fleet's one `Readiness`) is READY (takes work), WAITING (not ready since the
job started: still loading, its host unreachable, drifted from the fleet file — it joins once healthy) or
DOWN (its process is gone, or it failed requests and was drained). This module observes — the fleet's
judgement re-read, GET /health, silence with requests in flight — and `deploy.readiness.decide` judges. A
`HealthMonitor` probes every endpoint that is not READY — first asking the fleet (`admit`, with a fleet file:
the instance's readiness as its host reports it now, and where its tunnel is), then GET /health — at a
growing interval, and marks it READY once `decide` says so. With `--restart-dead` (`on_dead`), a DOWN endpoint
is restarted through the deploy layer in the background, so the other endpoints keep taking work meanwhile.
With none READY, the job waits a bounded time on one clock (`HealthMonitor.wait_left_s`): `--wait-ready` for
a first one at the start, `dead_timeout_s` mid-job (`--dead-timeout`). The hung guard (`--hung-after`) drains
an endpoint with no answer and a failing /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fleetgen.deploy.readiness import Judgement, Readiness, Seen, decide
from fleetgen.errors import EndpointError, FleetDown, FleetgenError
from fleetgen.generate.work import RetryPolicy
from fleetgen.http.client import EngineClient

PROBE_TIMEOUT_S = 5.0  # a probe of a server not taking work: a live one answers /health at once
OnDead = Callable[[str], Awaitable[object]]  # endpoint name → restart it (deploy layer); its result unused


@dataclass(eq=False)
class Endpoint:
    """One server as the job sees it; counters feed the progress view and the time series."""

    name: str
    client: EngineClient
    cap: int
    readiness: Readiness = Readiness.READY
    in_flight: int = 0
    num_failures_in_row: int = 0
    completions: int = 0
    output_tokens: int = 0
    num_restarts: int = 0
    last_error: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    answered_at: float = 0.0  # monotonic: its last answer (or when its first request in flight left)


class HealthMonitor:
    """Probes (and with `on_dead` restarts) the endpoints that are not READY; `on_ready` fires when one
    becomes READY. `admit` refreshes an endpoint from the fleet: READY (use it once /health says 200), WAITING
    (keep probing), DOWN (its process is gone: `on_dead` may start it). Its tasks start with it (those not
    ready when the job starts are probed from then on) and end with `close()`."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        policy: RetryPolicy,
        *,
        on_dead: OnDead | None = None,
        admit: Callable[[Endpoint], Awaitable[Judgement]] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.policy = policy
        self.on_ready: Callable[[], None] | None = None
        self.on_hung: Callable[[Endpoint, str], None] | None = None
        self._on_dead = on_dead
        self._admit = admit
        self._probing: set[Endpoint] = set()
        self._restarting: set[Endpoint] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._none_ready_since: float | None = None  # monotonic: since when no endpoint is READY
        for endpoint in self.endpoints:
            if endpoint.readiness is not Readiness.READY:
                self._look_after(endpoint)
        self._spawn(self._guard_hung())

    def lost(self, endpoint: Endpoint) -> None:
        """The endpoint failed (connection, repeated errors, hung; why in its `last_error`): DOWN, probed,
        restarted with `on_dead`."""
        seen = Seen(lost=endpoint.last_error or "drained", was=endpoint.readiness)
        endpoint.readiness = decide(seen).readiness
        self._look_after(endpoint)

    def wait_left_s(self, limit_s: float) -> float | None:
        """With no endpoint READY: the seconds left of `limit_s`, counted from when none was (the start's
        `--wait-ready`, the job's `dead_timeout_s`: one clock); None while one is."""
        if any(e.readiness is Readiness.READY for e in self.endpoints):
            return None
        if self._none_ready_since is None:
            self._none_ready_since = time.monotonic()
        return max(0.0, limit_s - (time.monotonic() - self._none_ready_since))

    async def close(self) -> None:
        """Stop the probes and restarts."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _look_after(self, endpoint: Endpoint) -> None:
        if endpoint not in self._probing:
            self._probing.add(endpoint)
            self._spawn(self._probe(endpoint))
        if endpoint.readiness is Readiness.DOWN:
            self._restart_soon(endpoint)

    async def _guard_hung(self) -> None:
        """A READY endpoint with requests in flight, no answer for `hung_after_s` and a /health that fails
        is hung (an engine whose scheduler died while its HTTP server lives): `on_hung` drains it, its
        requests go elsewhere, and the probe brings it back once healthy (`--restart-dead` restarts it)."""
        limit = self.policy.hung_after_s
        while True:
            await asyncio.sleep(min(limit / 4, 10.0))
            now = time.monotonic()
            for e in self.endpoints:
                if e.readiness is not Readiness.READY or not e.in_flight or now - e.answered_at < limit:
                    continue
                is_healthy = await e.client.is_healthy(timeout_s=min(self.policy.health_timeout_s, limit))
                silent_s, num = time.monotonic() - e.answered_at, e.in_flight
                silent = f"no answer for {silent_s:.0f} s with {num} requests in flight"
                readiness, why = decide(Seen(silent=silent, is_healthy=is_healthy, was=e.readiness))
                if readiness is Readiness.READY:
                    e.answered_at = now  # slow (long generations), not hung: look again after `limit`
                elif e.readiness is Readiness.READY and e.in_flight and self.on_hung is not None:
                    self.on_hung(e, why)

    def _restart_soon(self, endpoint: Endpoint) -> None:
        if self._on_dead is not None and endpoint not in self._restarting:
            self._restarting.add(endpoint)
            self._spawn(self._restart(endpoint, self._on_dead))

    async def _probe(self, endpoint: Endpoint) -> None:
        interval = self.policy.probe_interval_s
        try:
            while endpoint.readiness is not Readiness.READY:
                await asyncio.sleep(interval)
                await self._bring_back(endpoint)
                interval = min(interval * 2, self.policy.probe_interval_max_s)
        finally:
            self._probing.discard(endpoint)

    async def _restart(self, endpoint: Endpoint, on_dead: OnDead) -> None:
        """Restart a dead endpoint while it stays down, up to `restart_attempts` times; once it is back,
        check it at once (the probe's own interval may have grown long while it was dead)."""
        try:
            for attempt in range(self.policy.restart_attempts):
                if endpoint.readiness is Readiness.READY:
                    return
                if attempt:
                    await asyncio.sleep(self.policy.probe_interval_max_s)
                try:
                    await on_dead(endpoint.name)
                except FleetgenError as exc:  # the probe keeps watching; the reason shows in the live view
                    endpoint.last_error = f"restart failed: {exc.message}"
                    continue
                endpoint.num_restarts += 1
                await self._bring_back(endpoint)
                return
        finally:
            self._restarting.discard(endpoint)

    async def _bring_back(self, endpoint: Endpoint) -> None:
        """READY once the fleet (`admit`) and then its /health say so; a starting one that died is DOWN."""
        fleet: Judgement | None = None
        if self._admit is not None:
            try:
                fleet = await self._admit(endpoint)
            except FleetgenError as exc:  # e.g. the host is unreachable: not back yet, and why
                endpoint.last_error, fleet = exc.message, decide(Seen(unseen=exc.message))
        was = endpoint.readiness
        if was is Readiness.READY:
            return
        is_healthy = None  # asked only where the fleet vouches for it: else it cannot change the judgement
        if fleet is None or fleet.readiness is Readiness.READY:
            is_healthy = await endpoint.client.is_healthy(timeout_s=PROBE_TIMEOUT_S)
        endpoint.readiness = decide(Seen(fleet=fleet, is_healthy=is_healthy, was=was)).readiness
        if endpoint.readiness is Readiness.DOWN and was is Readiness.WAITING:
            self._restart_soon(endpoint)  # it was starting and died: a restart may bring it back
        if endpoint.readiness is Readiness.READY:
            endpoint.num_failures_in_row = 0
            self._none_ready_since = None
            if self.on_ready is not None:
                self.on_ready()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def served_models(
    monitor: HealthMonitor,
    *,
    wait_s: float,
    tick_s: float,
    on_wait: Callable[[float], None],
    is_stopped: Callable[[], bool],
) -> dict[str, str]:
    """The model each READY endpoint serves (GET /v1/models), from the first that answer.

    With none ready, wait up to `wait_s` for one (a big model loads for minutes; `fleetgen up` or a restart
    may be on its way), calling `on_wait(seconds left)` every `tick_s`; then raise FleetDown naming each
    endpoint's problem. An endpoint that does not answer is drained like a failing one. {} when stopped.
    """
    models: dict[str, str] = {}
    ready = asyncio.Event()
    monitor.on_ready = ready.set  # until the dispatcher takes it over
    while True:
        for endpoint in monitor.endpoints:
            if endpoint.readiness is Readiness.READY:
                try:
                    models[endpoint.name] = await endpoint.client.served_model()
                except EndpointError as exc:
                    endpoint.last_error = exc.message
                    monitor.lost(endpoint)
        if models or is_stopped():
            return models
        remaining = monitor.wait_left_s(wait_s)
        if remaining == 0.0:
            what = f"no server became ready within {wait_s:g} s" if wait_s > 0 else "no server is ready"
            raise FleetDown(
                f"{what}: nothing to generate with",
                context={"servers": states(monitor.endpoints, "not ready")},
                fix="see why with `fleetgen status -f FLEET` (and `fleetgen logs INSTANCE --fleet FLEET`), "
                "bring them up with `fleetgen up -f FLEET` (or rerun with --restart-dead, or a longer "
                "--wait-ready), then rerun the same command: it resumes. With --endpoint URLs: start those "
                "servers",
            )
        if remaining is not None:  # else one became READY meanwhile: ask it at once
            on_wait(remaining)
            ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), min(remaining, tick_s))


def states(endpoints: list[Endpoint], unknown: str) -> str:
    """One line per endpoint: its readiness and its last error (`unknown` when it has none)."""
    return "\n".join(f"{e.name} ({e.readiness.value}): {e.last_error or unknown}" for e in endpoints)
