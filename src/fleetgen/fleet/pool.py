"""The ready endpoints of a fleet, for `fleetgen run`: name, URL (a live tunnel), API key, concurrency.

Tunnels live as long as the SSH connections behind them. `open_endpoints` is the context manager that owns
them; `ready_endpoints` enters one into the caller's `AsyncExitStack` (or, without one, keeps the
connections open until the process exits: the duration of the command).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetgen.errors import FleetDown
from fleetgen.fleet.status import FleetView, InstanceStatus, open_view

# Views opened without a caller's stack: kept referenced so their tunnels stay up for the command.
_KEPT: list[contextlib.AsyncExitStack] = []


@dataclass(frozen=True)
class Endpoint:
    """One ready engine as a client sees it."""

    name: str
    url: str
    api_key: str | None
    max_running_requests: int | None


def endpoints_of(statuses: Sequence[InstanceStatus], api_key: str | None) -> list[Endpoint]:
    """The ready instances (healthy, no drift) as endpoints."""
    return [Endpoint(s.instance, s.url, api_key, s.max_running_requests) for s in statuses if s.ready]


@contextlib.asynccontextmanager
async def open_endpoints(
    fleet_path: Path, *, only: Sequence[str] | None = None
) -> AsyncIterator[tuple[list[Endpoint], FleetView]]:
    """Ready endpoints and the view behind them (`view.refresh()` re-reads load); tunnels close on exit."""
    async with open_view(fleet_path, only=only) as view:
        statuses = await view.refresh(rate_window_s=0)
        yield endpoints_of(statuses, view.secret), view


async def ready_endpoints(
    fleet_path: Path, *, stack: contextlib.AsyncExitStack | None = None, only: Sequence[str] | None = None
) -> list[Endpoint]:
    """Ready endpoints of the fleet, tunnels opened; raises FleetDown when none is ready."""
    if stack is None:
        stack = contextlib.AsyncExitStack()
        _KEPT.append(stack)
    endpoints, view = await stack.enter_async_context(open_endpoints(fleet_path, only=only))
    if not endpoints:
        statuses = await view.refresh(rate_window_s=0)
        detail = "\n".join(f"{s.instance}: {s.problem or 'not ready'}" for s in statuses)
        raise FleetDown(
            "no instance of the fleet is ready",
            context={"instances": detail},
            fix="run `fleetgen up` (then `fleetgen status` to see each instance)",
        )
    return endpoints
