"""What each endpoint's `/metrics` says while a job runs: its speculative-decoding accept length, its
running and waiting requests (`on_load`: the dispatcher fills a server whose engine runs past its figure),
and whether its engine moved since the read before (`on_engine`: the hung guard's evidence of progress).

The job's time series (`timeseries.accept_length`) is what the dashboard and report chart: how many tokens
each speculative step yields on each server, while generating *this* data. A background task reads every
endpoint's Prometheus text every few seconds, each at its own moment of the interval (not all at once: a
thousand pages in one burst stalled the dispatch), through its own one-connection client — never through the
dispatch connections, whose slots belong to chat requests — and parses only the samples fleetgen reads
(`Scrape.parse`: ~0.5 ms for SGLang's 530-line page) in the loop: a worker thread per page cost more in
handing over the GIL than the parse itself.

The accept length is `http.metrics.accept_length` (the one `status` shows): SGLang's gauge; vLLM's
1 + accepted / drafts over the window between two scrapes (the accept length of the last few seconds, not
of the server's whole life). A scrape that fails leaves the value unknown (None): the series has a gap,
the job goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from fleetgen.engines import engine_of_metrics, get_engine
from fleetgen.errors import EndpointError
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import Scrape, accept_length

DEFAULT_METRICS_PATH = "/metrics"
SCRAPE_TIMEOUT_S = 5.0
# The scrape's budget: at most this many pages a second, whatever the fleet's size. A page costs the driver
# ~1 ms (its HTTP read and the fast parse: bench/driver), so ~0.1 core; past 300 servers each is read less
# often than every 3 s (1,000 servers: every 10 s), which the hung guard (minutes) and the 5 s series bear.
MAX_PAGES_PER_S = 100.0


class MetricsScraper:
    """`run()` is the background task; `latest[name]` the last accept length seen (None: unknown); `on_load`
    (name, running, waiting) after each scrape that has both counts; `on_engine` (name, since) after each
    scrape that has the engine's moving samples (`MetricNames.moving`): since when it moved (monotonic: the
    read before, after which it changed), None when nothing changed (or no read before to compare)."""

    def __init__(
        self,
        endpoints: Callable[[], Sequence[tuple[str, str]]],
        kind: str | None,
        *,
        interval_s: float,
        api_key: str | None,
    ) -> None:
        """A scraper for a fleet of `kind` (None: bare URLs, whose engine is unknown). `endpoints` gives
        (name, URL) as they are now, read before each round: a server whose host was unreachable at the
        start is scraped at the URL it joins with."""
        self._engine = engine = get_engine(kind) if kind is not None else None
        self._path = engine.metrics_path if engine else DEFAULT_METRICS_PATH
        self._endpoints = endpoints
        self._api_key = api_key
        self._clients: dict[str, EngineClient] = {}
        self._interval_s = interval_s
        self._before: dict[str, dict[str, float]] = {}
        self._read_at: dict[str, float] = {}  # monotonic: when `_before` was read
        self.latest: dict[str, float | None] = {name: None for name, _ in endpoints()}
        self.on_load: Callable[[str, int, int], None] | None = None
        self.on_engine: Callable[[str, float | None], None] | None = None

    async def run(self) -> None:
        """Scrape every endpoint every `interval_s` (longer past `MAX_PAGES_PER_S`) until cancelled, each at
        its own moment of the interval (the k-th of N at k/N of it): a thousand servers' pages are read
        milliseconds apart, never in one burst beside the dispatch; reads fallen due while the loop was busy
        start at once (a sleep per read would take a whole loop turn each). An endpoint whose last read has
        not ended (a slow server) is skipped."""
        reading: dict[str, asyncio.Task[None]] = {}
        async with contextlib.AsyncExitStack() as stack:
            try:
                while True:
                    start, named = time.monotonic(), self._endpoints()
                    interval_s = max(self._interval_s, len(named) / MAX_PAGES_PER_S)
                    for k, (name, url) in enumerate(named):
                        wait = start + k * interval_s / len(named) - time.monotonic()
                        if wait > 0:  # else behind (a busy loop): it starts now, with no loop turn between
                            await asyncio.sleep(wait)
                        client = await self._client(stack, name, url)
                        if client is not None and name not in reading:
                            reading[name] = asyncio.create_task(self._read(name, client, reading))
                    await asyncio.sleep(max(0.0, start + interval_s - time.monotonic()))
            finally:
                for task in reading.values():
                    task.cancel()
                await asyncio.gather(*reading.values(), return_exceptions=True)

    async def _client(self, stack: contextlib.AsyncExitStack, name: str, url: str) -> EngineClient | None:
        """`name`'s client, a new one when its URL changed (another server: no window across the two)."""
        client = self._clients.get(name)
        if url and (client is None or client.base_url != url.rstrip("/")):
            client = EngineClient(url, api_key=self._api_key, timeout_s=SCRAPE_TIMEOUT_S, max_connections=1)
            self._clients[name] = client = await stack.enter_async_context(client)
            self._before.pop(name, None)
        return client

    async def _read(self, name: str, client: EngineClient, reading: dict[str, asyncio.Task[None]]) -> None:
        try:
            await self._scrape(name, client)
        finally:
            reading.pop(name, None)

    async def _scrape(self, name: str, client: EngineClient) -> None:
        try:
            samples = Scrape.parse(await client.get_text(self._path)).samples  # ~0.5 ms: in the loop
        except EndpointError:  # down, restarting, no metrics, unparseable: a gap in the series
            self.latest[name] = None
            return
        engine = self._engine or engine_of_metrics(samples)
        before, read_at = self._before.get(name), self._read_at.get(name)
        self.latest[name] = accept_length(engine, samples, before)
        self._before[name], self._read_at[name] = samples, time.monotonic()
        moving = [m for m in engine.metrics.moving if m in samples]
        if self.on_engine is not None and moving:
            moved = before is not None and any(before.get(m) != samples[m] for m in moving)
            self.on_engine(name, read_at if moved else None)
        running, waiting = samples.get(engine.metrics.running), samples.get(engine.metrics.queued)
        if self.on_load is not None and running is not None and waiting is not None:
            self.on_load(name, int(running), int(waiting))
