"""Speculative-decoding accept length per endpoint, scraped from `/metrics` while a job runs.

The job's time series (`timeseries.accept_length`) is what the dashboard and report chart: how many tokens
each speculative step yields on each server, while generating *this* data. A background task reads every
endpoint's Prometheus text every few seconds on its own small HTTP session — never through the dispatch
connections, whose slots belong to chat requests — and parses it on a worker thread, so a large exposition
(vLLM's histograms) never stalls the event loop that dispatches.

SGLang exports a gauge (`sglang:spec_accept_length`); vLLM only counters, so its value is
1 + accepted / drafts over the window between two scrapes (the accept length of the last few seconds, not
of the server's whole life). A scrape that fails leaves the value unknown (None): the series has a gap,
the job goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

import aiohttp

from fleetgen.deploy.probe import accept_length, parse_metrics
from fleetgen.engines import ENGINES, MetricNames, get_engine
from fleetgen.errors import EndpointError

DEFAULT_METRICS_PATH = "/metrics"
SCRAPE_TIMEOUT_S = 5.0


def metric_names_for(kind: str | None) -> tuple[MetricNames, ...]:
    """The metric names to look for: the fleet's engine, or every registered engine (bare `--endpoint`)."""
    if kind is not None:
        return (get_engine(kind).metrics,)
    return tuple(engine.metrics for engine in ENGINES.values())


def window_accept_length(
    names: Sequence[MetricNames], now: Mapping[str, float], before: Mapping[str, float] | None
) -> float | None:
    """Accept length from one scrape (`now`), over the window since `before` for counter-only engines.

    None when speculative decoding is off or made no step in the window.
    """
    for engine_names in names:
        samples = dict(now)
        drafts, accepted = engine_names.spec_num_drafts_total, engine_names.spec_num_accepted_tokens_total
        if before is not None and drafts and drafts in now and drafts in before:
            delta = now[drafts] - before[drafts]
            if delta >= 0:  # a counter that went down means the engine restarted: use its new totals
                samples[drafts] = delta
                samples[accepted] = now.get(accepted, 0.0) - before.get(accepted, 0.0)
        value = accept_length(engine_names, samples)
        if value is not None:
            return value
    return None


class AcceptLengthScraper:
    """`run()` is the background task; `latest[name]` the last accept length seen (None: unknown)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, str]],
        names: Sequence[MetricNames],
        *,
        metrics_path: str = DEFAULT_METRICS_PATH,
        interval_s: float = 3.0,
        api_key: str | None = None,
    ) -> None:
        self._urls = {name: url.rstrip("/") + metrics_path for name, url in endpoints}
        self._names = tuple(names)
        self._interval_s = interval_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._before: dict[str, dict[str, float]] = {}
        self.latest: dict[str, float | None] = {name: None for name in self._urls}

    @classmethod
    def for_engine(
        cls, endpoints: Sequence[tuple[str, str]], kind: str | None, *, interval_s: float, api_key: str | None
    ) -> AcceptLengthScraper:
        """A scraper for a fleet of `kind` (None: bare URLs, whose engine is unknown)."""
        path = get_engine(kind).metrics_path if kind is not None else DEFAULT_METRICS_PATH
        return cls(
            endpoints, metric_names_for(kind), metrics_path=path, interval_s=interval_s, api_key=api_key
        )

    async def run(self) -> None:
        """Scrape every endpoint every `interval_s` until cancelled."""
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        # One connection per endpoint at most: the scraper must never compete with chat requests.
        connector = aiohttp.TCPConnector(limit=max(len(self._urls), 1), limit_per_host=1)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._headers) as http:
            while True:
                await asyncio.gather(*(self._scrape(http, name, url) for name, url in self._urls.items()))
                await asyncio.sleep(self._interval_s)

    async def _scrape(self, http: aiohttp.ClientSession, name: str, url: str) -> None:
        text = await _get_text(http, url)
        if text is None:
            self.latest[name] = None
            return
        try:
            samples = await asyncio.to_thread(parse_metrics, text)
        except EndpointError:
            self.latest[name] = None
            return
        self.latest[name] = window_accept_length(self._names, samples, self._before.get(name))
        self._before[name] = samples


async def _get_text(http: aiohttp.ClientSession, url: str) -> str | None:
    """The body of GET `url`, or None when the server does not answer 200 (down, restarting, no metrics)."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        async with http.get(url) as resp:
            if resp.status == 200:
                return await resp.text()
    return None
