"""The peer: `run`'s scraper as it was before the fast read (fleetgen 1124f20, generate/scrape.py), for
`driver.py --scrape old`: every endpoint's page read in one burst each interval (`asyncio.gather`), each
page parsed whole by prometheus_client on a worker thread. Installed over `MetricsScraper`'s own `run` and
`_scrape`; the accept length and the hung guard's evidence are computed as the new one computes them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from fleetgen.engines import engine_of_metrics
from fleetgen.errors import EndpointError
from fleetgen.generate.scrape import SCRAPE_TIMEOUT_S, MetricsScraper
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import Scrape, accept_length


def old_parse(text: str, at: float = 0.0) -> Scrape:
    """The whole page through prometheus_client, samples summed by name (`Scrape.parse` before)."""
    totals: dict[str, float] = {}
    labels: dict[str, Mapping[str, str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
                labels.setdefault(sample.name, sample.labels)
    except ValueError as exc:
        raise EndpointError(f"unparseable /metrics text: {exc}") from exc
    return Scrape(at, totals, labels)


async def old_run(self: MetricsScraper) -> None:
    async with contextlib.AsyncExitStack() as stack:
        while True:
            for name, url in self._endpoints():
                client = self._clients.get(name)
                if url and (client is None or client.base_url != url.rstrip("/")):
                    client = EngineClient(
                        url, api_key=self._api_key, timeout_s=SCRAPE_TIMEOUT_S, max_connections=1
                    )
                    self._clients[name] = await stack.enter_async_context(client)
                    self._before.pop(name, None)
            await asyncio.gather(*(self._scrape(name, c) for name, c in self._clients.items()))
            await asyncio.sleep(self._interval_s)


def old_scrape(
    parse: Callable[[str, float], Scrape],
) -> Callable[[MetricsScraper, str, EngineClient], object]:
    async def scrape(self: MetricsScraper, name: str, client: EngineClient) -> None:
        try:
            samples = (await asyncio.to_thread(parse, await client.get_text(self._path), 0.0)).samples
        except EndpointError:
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

    return scrape


def install(parse: Callable[[str, float], Scrape]) -> None:
    """The old scraper over `MetricsScraper`, parsing with `parse` (counted by the caller)."""
    MetricsScraper.run = old_run  # type: ignore[method-assign]
    MetricsScraper._scrape = old_scrape(parse)  # type: ignore[method-assign,assignment]
