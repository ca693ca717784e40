"""What an engine says of itself now, read one way for every caller: a fleet's instance (`FleetView`, for
`status`, `run`, `bench` and the dashboard) and a bare `--endpoint` URL (the dashboard's `EndpointSource`).

One read is /metrics (the load: running, queued, tok/s, KV use, accept length) and the engine's info JSON
(SGLang's /server_info), from which the engine's own rules give its max running requests (`Engine`'s
`max_running_from_info`, else `max_running_from_capacity` under the argv's cap). The caller knows the engine
(a fleet file's) or not (a bare URL: its metric names say which). Whether the instance takes work is the
caller's to judge (`Readiness`): this module reports, with a problem text where the info JSON did not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgen.deploy.verify import flag_value
from fleetgen.engines import engine_of_metrics
from fleetgen.engines.base import Engine
from fleetgen.errors import EndpointError
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import Load, Scrape, load_from


@dataclass(frozen=True)
class EngineState:
    """An engine's load and max running requests, as read now; `scrape` is the next read's `before`."""

    load: Load
    max_running_requests: int | None
    scrape: Scrape
    problem: str = ""  # the info JSON did not answer: what it said instead
    running_is_floor: bool = False  # max_running_requests is a floor the engine runs past (`Engine`'s)


async def read_engine(
    client: EngineClient,
    engine: Engine | None,
    before: Scrape | None,
    *,
    args: Sequence[str] = (),
    rate_window_s: float = 0.0,
) -> EngineState:
    """One read of the engine behind `client` (None: recognised from its metric names). Throughput needs two
    scrapes for engines that only export counters: `before` (the previous read's), or a second one
    `rate_window_s` later. `args`: the instance's argv, for its max-running cap. EndpointError when /metrics
    does not answer."""
    scrape = await client.metrics(engine.metrics_path if engine else "/metrics")
    engine = engine or engine_of_metrics(scrape.samples)
    info, problem = None, ""
    try:
        info = await client.info(engine.info_paths)
    except EndpointError as exc:  # the load still reads from /metrics
        problem = exc.message
    if not engine.metrics.gen_throughput and before is None and rate_window_s > 0:
        await asyncio.sleep(rate_window_s)
        before, scrape = scrape, await client.metrics(engine.metrics_path)
    capacity = engine.capacity((), info, scrape.labels)
    cap = flag_value(args, engine.max_running_flags)
    said = engine.max_running_from_info(info)
    max_running = said or engine.max_running_from_capacity(capacity, cap)
    is_floor = max_running is not None and said is None and engine.running_is_floor(cap)
    return EngineState(load_from(engine, scrape, before, info), max_running, scrape, problem, is_floor)
