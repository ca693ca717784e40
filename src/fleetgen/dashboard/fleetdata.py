"""Fleet rows for the dashboard, from either source `run` itself accepts.

- a fleet file (`-f`): `fleetgen.fleet.status.FleetView`, the same live truth `fleetgen status` shows
  (process, drift, health, load, through tunnels kept open while the page is served);
- plain endpoints (`--endpoint URL`): each server's own health, /metrics and info endpoint, read directly.
  The engine is recognised from its metric names (`sglang:` / `vllm:`), so no fleet file is needed.

Planned capacity comes from the plan of the fleet file when its model config is readable; a plan that
cannot be made leaves the column empty and says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from fleetgen.config import FleetFile
from fleetgen.dashboard.model import InstanceRow
from fleetgen.deploy.hostside import local_shape
from fleetgen.engines import engine_of_metrics
from fleetgen.errors import EndpointError, FleetgenError
from fleetgen.fleet.status import FleetView, Readiness
from fleetgen.http.client import EngineClient, named_urls
from fleetgen.http.metrics import Scrape, load_from
from fleetgen.plan.fleet import facts_from_file, plan_fleet

HEALTH_PATH = "/health"
PROBE_TIMEOUT_S = 3.0  # a sick server must turn red within seconds, not after a 30 s client timeout


@dataclass(frozen=True)
class FleetViewSource:
    """Rows from an open `FleetView` (the caller keeps it open while the dashboard runs)."""

    view: FleetView
    planned: Mapping[str, int]

    async def __call__(self) -> Sequence[InstanceRow]:
        statuses = await self.view.refresh(rate_window_s=0.0)
        return [InstanceRow(**vars(s), planned_capacity=self.planned.get(s.instance)) for s in statuses]


@dataclass
class _Endpoint:
    name: str
    url: str
    before: Scrape | None = None


class EndpointSource:
    """Rows read straight from servers given as URLs: health, /metrics, info (SGLang /server_info)."""

    def __init__(self, urls: Sequence[str], http: aiohttp.ClientSession) -> None:
        self.endpoints = [_Endpoint(name, url) for name, url in named_urls(urls)]
        self.http = http

    async def __call__(self) -> Sequence[InstanceRow]:
        return await asyncio.gather(*(self._row(e) for e in self.endpoints))

    async def _row(self, endpoint: _Endpoint) -> InstanceRow:
        client = EngineClient(endpoint.url, session=self.http, timeout_s=PROBE_TIMEOUT_S)
        where = urlsplit(endpoint.url)
        row = InstanceRow(endpoint.name, where.hostname or "", (), where.port or 0, url=endpoint.url)
        # Both engines serve /health; which engine it is shows only in the metric names, read after.
        if not await client.is_healthy(HEALTH_PATH):
            row.readiness, row.problem = Readiness.DOWN, f"GET {endpoint.url}{HEALTH_PATH} did not answer 200"
            return row
        row.readiness = Readiness.READY
        try:
            scrape = await client.metrics()
        except EndpointError as exc:
            row.problem = f"no metrics: {exc.message} (SGLang serves them with --enable-metrics)"
            return row
        engine = engine_of_metrics(scrape.samples)
        try:
            info = await client.info(engine.info_paths)
        except EndpointError:  # no info JSON: the row keeps what /metrics says
            info = None
        load = load_from(engine, scrape, endpoint.before, info)
        endpoint.before = scrape
        row.running, row.queued = load.running, load.queued
        row.gen_tokens_per_s, row.spec_accept_length = load.gen_tokens_per_s, load.spec_accept_length
        row.kv_usage = load.kv_usage
        row.max_running_requests = engine.max_running_from_info(info)
        return row


def planned_capacity(fleet: FleetFile, fleet_path: Path) -> tuple[dict[str, int], str]:
    """Max running requests per instance as `fleetgen plan` computes it, and "" — or ({}, why not).

    Blocking (reads the model's config.json): call it in a thread.
    """
    try:
        shape = local_shape(fleet.engine.model_config_dir or fleet.engine.model, fleet_path)
        facts = {host.name: facts_from_file(host) for host in fleet.hosts}
        plan = plan_fleet(fleet, shape, facts, fleet.engine.version)
    except FleetgenError as exc:
        return {}, f"planned capacity unknown: {exc.message}" + (f" ({exc.fix})" if exc.fix else "")
    return {
        p.instance: p.memory.max_running_requests for p in plan.instances if p.memory.max_running_requests
    }, ""
