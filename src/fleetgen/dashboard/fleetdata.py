"""Fleet rows for the dashboard, from either source `run` itself accepts.

- a fleet file (`-f`): `fleetgen.fleet.status.FleetView`, the same live truth `fleetgen status` shows
  (process, drift, health, load, through tunnels kept open while the page is served);
- plain endpoints (`--endpoint URL`): each server's own health, judged by `deploy.readiness.decide` as a bare
  URL (by its health alone, as `run --endpoint` judges it), then its /metrics and info endpoint read by the
  same reader as a fleet's (`fleet.enginestate`), a remark when they do not answer. The engine is recognised
  from its metric names (`sglang:` / `vllm:`), so no fleet file is needed.

Planned capacity comes from the plan of the fleet file, its model's shape read as `plan` and `up` read it; a
plan that cannot be made leaves the column empty and says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from fleetgen.dashboard.model import InstanceRow
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.modelshape import model_shape
from fleetgen.deploy.readiness import Readiness, Seen, decide
from fleetgen.errors import EndpointError, FleetgenError
from fleetgen.fleet.enginestate import read_engine
from fleetgen.fleet.status import FleetView
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import Scrape
from fleetgen.http.urls import BareURLs
from fleetgen.plan.fleet import facts_from_file, plan_fleet
from fleetgen.remote.base import Host

HEALTH_PATH = "/health"
PROBE_TIMEOUT_S = 3.0  # a sick server must turn red within seconds, not after a 30 s client timeout


@dataclass(frozen=True)
class FleetViewSource:
    """Rows from an open `FleetView` (the caller keeps it open while the dashboard runs)."""

    view: FleetView
    planned: Mapping[str, int]

    async def __call__(self) -> Sequence[InstanceRow]:
        statuses = await self.view.refresh(rate_window_s=0.0)
        return [
            InstanceRow(**vars(s), planned_max_running_requests=self.planned.get(s.instance))
            for s in statuses
        ]


@dataclass
class _Endpoint:
    name: str
    url: str
    before: Scrape | None = None


class EndpointSource:
    """Rows read straight from servers given as URLs: health, /metrics, info (SGLang /server_info)."""

    def __init__(self, servers: BareURLs, http: aiohttp.ClientSession) -> None:
        self.endpoints = [_Endpoint(name, url) for name, url in servers.named()]
        self.http = http

    async def __call__(self) -> Sequence[InstanceRow]:
        return await asyncio.gather(*(self._row(e) for e in self.endpoints))

    async def _row(self, endpoint: _Endpoint) -> InstanceRow:
        client = EngineClient(endpoint.url, session=self.http, timeout_s=PROBE_TIMEOUT_S)
        where = urlsplit(endpoint.url)
        row = InstanceRow(endpoint.name, where.hostname or "", (), where.port or 0, url=endpoint.url)
        # Both engines serve /health; which engine it is shows only in the metric names, read after.
        row.readiness, why = decide(Seen(is_healthy=await client.is_healthy(HEALTH_PATH)))
        if row.readiness is not Readiness.READY:
            row.problem = f"{why}: GET {endpoint.url}{HEALTH_PATH}"
            return row
        try:  # its engine's own numbers: a remark beside a bare URL's readiness, never a condition of it
            state = await read_engine(client, None, endpoint.before)
        except EndpointError as exc:
            row.problem = f"no metrics: {exc.message} (SGLang serves them with --enable-metrics)"
            return row
        row.problem = state.problem
        endpoint.before, load = state.scrape, state.load
        row.running, row.queued = load.running, load.queued
        row.gen_tokens_per_s, row.spec_accept_length = load.gen_tokens_per_s, load.spec_accept_length
        row.kv_usage = load.kv_usage
        row.max_running_requests = state.max_running_requests
        return row


async def planned_max_running_requests(fleet: Fleet, model_host: Host | None) -> tuple[dict[str, int], str]:
    """Max running requests per instance as `fleetgen plan` computes it, and "" — or ({}, why not). The
    model's shape is read as `plan` and `up` read it (`model_shape`: `engine.model_config` here, else
    `engine.model` on `model_host`), never from a folder here that merely has the model's name."""
    cfg = fleet.file.engine
    try:
        shape = await model_shape(cfg, fleet.path, model_host)
        facts = {host.name: facts_from_file(host) for host in fleet.file.hosts}
        plan = plan_fleet(fleet.file, shape, facts, cfg.version)
    except FleetgenError as exc:
        return {}, f"planned capacity unknown: {exc.message}" + (f" ({exc.fix})" if exc.fix else "")
    return {
        p.instance: p.memory.max_running_requests for p in plan.instances if p.memory.max_running_requests
    }, ""
