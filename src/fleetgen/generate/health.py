"""Which servers of a job may take work, and bringing the others (back) in.

An endpoint's `readiness` (the fleet's one `Readiness`) is READY (takes work), WAITING (not ready since the
job started: still loading, its host unreachable, drifted from the fleet file, not answered yet — it joins
once healthy) or DOWN (its process is gone, or it failed requests, or hung, and was drained). This module
observes — the fleet's judgement re-read, GET /health, a probe request, progress with requests in flight —
and `deploy.readiness.decide` judges. A `HealthMonitor` probes every endpoint that is not READY — first
asking the fleet (`admit`, with a fleet file: the instance's readiness as its host reports it now, and where
its tunnel is), then GET /health, then, for one the job drained (DOWN) once the model is known, one tiny
chat request (`EngineClient.probe`): /health answers 200 on a server that fails every request or generates
nothing, so only an answered request brings a drained one back (once: no "down / ready again" every few
seconds). With `--restart-dead` (`on_dead`), a DOWN endpoint is restarted through the deploy layer in the
background, so the other endpoints keep taking work meanwhile; one the job lost is first asked of the fleet
(`admit`), so its end is said in the placement's words (a Ray actor killed, a node lost, a Slurm job's end:
what `status` says) before the restart replaces what could say it. With none READY, the job waits a bounded
time on one clock (`HealthMonitor.wait_left_s`): `--wait-ready` for a first one at the start,
`dead_timeout_s` mid-job (`--dead-timeout`).

The hung guard (`--hung-after`) judges a hang by progress, not by /health (SGLang answers /health while its
scheduler generates nothing: sgl-project/sglang#30314): progress is an answer to one of the job's requests
(`Endpoint.progress_at`, set by the dispatcher) or the engine's own samples moving between two /metrics reads
(`progressed`, fed by the job's scraper: `MetricNames.moving`; a move is dated from the read before it, so a
stall is counted from at most one scrape interval before it began). It looks every probe interval, so an
endpoint with requests in flight and no progress for `hung_after_s` is drained within `hung_after_s` plus one
probe interval (it used to wait on /health with a timeout as long again: about twice `--hung-after`); only
where no engine sample was ever read (a bare URL without /metrics) does /health decide, as it must: a long
generation answers nothing for minutes.

At the start (`served_models`), every READY endpoint is asked its model at once; the job starts with those
that answered by the first answer plus `JOIN_GRACE_S`, and one that has not answered yet is WAITING until it
does (a hung one holds no one up).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from fleetgen.deploy.readiness import Judgement, Readiness, Seen, decide
from fleetgen.errors import EndpointError, FleetDown, FleetgenError
from fleetgen.generate.work import RetryPolicy
from fleetgen.http.client import EngineClient

PROBE_TIMEOUT_S = 5.0  # a probe of a server not taking work: a live one answers /health at once
# A job's start (its fleet's first read, `FleetLinks.read_all`, then its servers' models, `first_models`):
# how long the others may still answer once a first has, before the job starts with those that did.
JOIN_GRACE_S = 1.0
NOT_ANSWERED = "has not answered GET /v1/models yet: it joins when it does"
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
    # monotonic: its last progress (an answer, its engine's samples moving), or when its first request in
    # flight left; what the hung guard counts silence from
    progress_at: float = 0.0
    is_counted: bool = False  # its engine's moving samples were read: /health does not vouch for progress


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
        self._by_name = {e.name: e for e in endpoints}  # the scraper's reads, one per endpoint every 3 s
        self.policy = policy
        self.on_ready: Callable[[], None] | None = None
        self.on_hung: Callable[[Endpoint, str], None] | None = None
        self._on_dead = on_dead
        self._admit = admit
        self._probing: set[Endpoint] = set()
        self._restarting: set[Endpoint] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._none_ready_since: float | None = None  # monotonic: since when no endpoint is READY
        self._judging: set[Endpoint] = set()  # silent ones being judged (a bare URL's /health is asked)
        self.model: str | None = None  # the served model, once known: a drained endpoint's probe asks it
        for endpoint in self.endpoints:
            if endpoint.readiness is not Readiness.READY:
                self._look_after(endpoint)
        self._spawn(self._guard_hung())

    def lost(self, endpoint: Endpoint) -> None:
        """The endpoint failed (connection, repeated errors, hung; why in its `last_error`, the job's words):
        DOWN, probed, restarted with `on_dead` once its fleet said why (`_ask_why`)."""
        seen = Seen(lost=endpoint.last_error or "drained", was=endpoint.readiness)
        endpoint.readiness = decide(seen).readiness
        self._look_after(endpoint, ask_why=True)

    def progressed(self, name: str, since: float | None) -> None:
        """The job's scraper read `name`'s engine samples: moved since `since` (monotonic), or not (None)."""
        endpoint = self._by_name[name]
        endpoint.is_counted = True
        if since is not None:
            endpoint.progress_at = max(endpoint.progress_at, since)

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

    def _look_after(self, endpoint: Endpoint, *, ask_why: bool = False) -> None:
        if endpoint not in self._probing:
            self._probing.add(endpoint)
            self._spawn(self._probe(endpoint))
        if endpoint.readiness is Readiness.DOWN:
            self._restart_soon(endpoint, ask_why=ask_why)

    async def _guard_hung(self) -> None:
        """A READY endpoint with requests in flight and no progress for `hung_after_s` is hung (an engine
        whose scheduler died or stalls while its HTTP server lives): `on_hung` drains it, its requests go
        elsewhere, and the probe brings it back once a probe request is answered (`--restart-dead` restarts
        it). Looked at every probe interval; no endpoint waits on another's /health."""
        limit = self.policy.hung_after_s
        while True:
            await asyncio.sleep(self.policy.probe_interval_s)
            now = time.monotonic()
            for e in self.endpoints:
                silent = e.readiness is Readiness.READY and e.in_flight and now - e.progress_at >= limit
                if silent and e not in self._judging:
                    self._judging.add(e)
                    self._spawn(self._judge_silent(e))

    async def _judge_silent(self, e: Endpoint) -> None:
        """Hung, or (no engine samples read: /health answers) slow: looked at again after `hung_after_s`."""
        limit = self.policy.hung_after_s
        try:
            is_healthy = None
            if not e.is_counted:
                is_healthy = await e.client.is_healthy(timeout_s=min(self.policy.health_timeout_s, limit))
            silent_s, num = time.monotonic() - e.progress_at, e.in_flight
            silent = f"no progress for {silent_s:.0f} s with {num} requests in flight"
            seen = Seen(silent=silent, counted=e.is_counted, is_healthy=is_healthy, was=e.readiness)
            readiness, why = decide(seen)
            if readiness is Readiness.READY:
                e.progress_at = (
                    time.monotonic()
                )  # slow (long generations), not hung: look again after `limit`
            elif e.readiness is Readiness.READY and e.in_flight and self.on_hung is not None:
                self.on_hung(e, why)
        finally:
            self._judging.discard(e)

    def _restart_soon(self, endpoint: Endpoint, *, ask_why: bool = False) -> None:
        if self._on_dead is not None and endpoint not in self._restarting:
            self._restarting.add(endpoint)
            self._spawn(self._restart(endpoint, self._on_dead, ask_why))

    async def _probe(self, endpoint: Endpoint) -> None:
        interval = self.policy.probe_interval_s
        try:
            while endpoint.readiness is not Readiness.READY:
                await asyncio.sleep(interval)
                await self._bring_back(endpoint)
                interval = min(interval * 2, self.policy.probe_interval_max_s)
        finally:
            self._probing.discard(endpoint)

    async def _restart(self, endpoint: Endpoint, on_dead: OnDead, ask_why: bool) -> None:
        """Restart a dead endpoint while it stays down, up to `restart_attempts` times (`ask_why`: lost by the
        job, its fleet asked why first); once it is back, check it at once (the probe's own interval may have
        grown long while it was dead)."""
        try:
            if ask_why:
                await self._ask_why(endpoint)
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

    async def _ask_why(self, endpoint: Endpoint) -> None:
        """A lost endpoint's end as its fleet says it (`admit`: a Ray actor killed or its node lost, a Slurm
        job's end, an engine's last error in its log, in the words `status` uses), asked before a restart
        replaces what could tell. Only a fleet that finds it gone (DOWN) says it better than the job: one
        whose server lives (a failed request; hung: the job's "no progress for …" says more than "health does
        not answer") or that cannot be read leaves the job's own words."""
        if self._admit is None:
            return
        said = endpoint.last_error
        try:
            readiness, why = await self._admit(endpoint)
        except FleetgenError:  # its host unreachable: the probe says so once it asks again
            readiness, why = Readiness.WAITING, ""
        endpoint.last_error = why if readiness is Readiness.DOWN and why else said

    async def _bring_back(self, endpoint: Endpoint) -> None:
        """READY once the fleet (`admit`) and then its /health say so, and, for one the job drained (DOWN)
        once the model is known, a probe request is answered; a starting one that died is DOWN."""
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
        seen = Seen(fleet=fleet, is_healthy=is_healthy, was=was)
        if decide(seen).readiness is Readiness.READY and was is Readiness.DOWN and self.model is not None:
            failed = await endpoint.client.probe(self.model, self.policy.health_timeout_s)
            seen = replace(seen, failing=failed.message if failed is not None else "")
        endpoint.readiness = decide(seen).readiness  # its last_error stays the why it went down
        if endpoint.readiness is Readiness.DOWN and was is Readiness.WAITING:
            self._restart_soon(endpoint)  # it was starting and died: a restart may bring it back
        if endpoint.readiness is Readiness.READY:
            self._ready(endpoint)

    def _ready(self, endpoint: Endpoint) -> None:
        endpoint.readiness = Readiness.READY
        endpoint.num_failures_in_row = 0
        endpoint.progress_at = time.monotonic()  # its silence counts from now, not from before it was out
        self._none_ready_since = None
        if self.on_ready is not None:
            self.on_ready()

    async def first_models(self, endpoints: list[Endpoint]) -> dict[str, str]:
        """The model each of `endpoints` serves (GET /v1/models), all asked at once: those that answered by
        the first answer plus `JOIN_GRACE_S` (none: every one failed). One that has not answered by then is
        WAITING; once it answers it joins (READY) where it serves a model those first ones serve, else it is
        DOWN and says why; one that fails is drained (`lost`) as a failing one."""
        first: dict[str, str] = {}
        pending = set(endpoints)
        answered, settled, started = asyncio.Event(), asyncio.Event(), False

        async def ask(e: Endpoint) -> None:
            try:
                model = await e.client.served_model()
            except EndpointError as exc:
                e.last_error = exc.message
                self.lost(e)
            else:
                if not started:
                    first[e.name] = model
                elif model in first.values():
                    self._ready(e)
                else:
                    e.readiness = Readiness.DOWN
                    e.last_error = f"it serves {model!r}, the job's servers {sorted(set(first.values()))}"
            finally:
                pending.discard(e)
                if first or not pending:
                    answered.set()
                if not pending:
                    settled.set()

        for e in endpoints:
            self._spawn(ask(e))
        await answered.wait()
        if first:  # the others' answers a moment later: no WAITING line for them
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), JOIN_GRACE_S)
        started = True
        for e in pending:
            e.readiness, e.last_error = Readiness.WAITING, NOT_ANSWERED
        self.model = next(iter(first.values()), None)
        return dict(first)

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
    """The model each READY endpoint serves (GET /v1/models), from the first that answer
    (`HealthMonitor.first_models`: the others join when they answer).

    With none ready, wait up to `wait_s` for one (a big model loads for minutes; `fleetgen up` or a restart
    may be on its way), calling `on_wait(seconds left)` every `tick_s`; then raise FleetDown naming each
    endpoint's problem. An endpoint that does not answer is drained like a failing one. {} when stopped.
    """
    models: dict[str, str] = {}
    ready = asyncio.Event()
    monitor.on_ready = ready.set  # until the dispatcher takes it over
    while True:
        asking = [e for e in monitor.endpoints if e.readiness is Readiness.READY]
        if asking:
            models = await monitor.first_models(asking)
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
