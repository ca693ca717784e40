"""The live dashboard's HTTP server (aiohttp.web), bound to 127.0.0.1 only.

One refresh task reads the job store and the fleet status every second and keeps the latest state; page
loads and polls only read that state, so ten open tabs cost what one does. A failing source (no store yet,
an unreachable host) becomes a notice on the page, never a blank page and never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from aiohttp import web

from fleetgen.dashboard import page
from fleetgen.dashboard.jobdata import JobReader
from fleetgen.dashboard.model import InstanceRow, JobView, Sample
from fleetgen.deploy.readiness import Readiness
from fleetgen.errors import ConfigError, FleetgenError

LOOPBACK = "127.0.0.1"  # never another address: from elsewhere, users tunnel (ssh -L) to it
REFRESH_S = 1.0
LIVE_SAMPLES = 100_000  # accept lengths scraped while the page is served (hours of a dozen instances)
FleetSource = Callable[[], Awaitable[Sequence[InstanceRow]]]


async def no_fleet() -> Sequence[InstanceRow]:
    """A fleet source for a job whose fleet is unknown: no rows."""
    return ()


class Dashboard:
    """The state behind the page: the latest job view and fleet rows, refreshed by `refresh_forever`.

    `out_dir` None: a fleet-only page. `notes` are standing remarks (e.g. why planned capacity is unknown).
    """

    def __init__(
        self, out_dir: Path | None, fleet: FleetSource, subtitle: str, notes: Sequence[str] = ()
    ) -> None:
        self.reader = JobReader(out_dir) if out_dir is not None else None
        self.fleet = fleet
        self.subtitle = subtitle
        self.notes = [n for n in notes if n]
        if self.reader is None:
            self.notes.append("no job folder given (-o OUT_DIR): showing the fleet only")
        self.job = JobView(out_dir=str(out_dir or ""))
        self.rows: Sequence[InstanceRow] = ()
        self.live: deque[Sample] = deque(maxlen=LIVE_SAMPLES)
        self.refresher: asyncio.Task[None] | None = None
        self.state: dict[str, Any] = self._state(self.notes)

    async def refresh(self) -> None:
        """Read both sources once; a source that fails keeps its last value and adds a notice."""
        notices = list(self.notes)
        try:
            if self.reader is not None:
                self.job = await asyncio.to_thread(self.reader.read)
        except FleetgenError as exc:
            notices.append(f"job: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        try:
            self.rows = await self.fleet()
        except FleetgenError as exc:
            notices.append(f"fleet: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        now = time.time()
        self.live.extend(
            Sample(ts=now, instance=r.instance, accept_len=r.spec_accept_length)
            for r in self.rows
            if r.readiness is Readiness.READY and r.spec_accept_length is not None
        )
        self.state = self._state(notices)

    def _state(self, notices: Sequence[str]) -> dict[str, Any]:
        state = page.state(self.job, self.rows, tuple(self.live))
        state["fragments"]["notice"] = "".join(f"<p>{escape(n)}</p>" for n in notices)
        return state

    async def refresh_forever(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_S)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def make_app(dashboard: Dashboard) -> web.Application:
    """Routes: `/` (the page), `/api/state` (what each poll reads), `/static/…` (CSS and script)."""

    async def index(_: web.Request) -> web.Response:
        html = page.dashboard_page(dashboard.state, dashboard.subtitle)
        return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def api_state(_: web.Request) -> web.Response:
        refresher = dashboard.refresher
        if refresher is not None and refresher.done() and not refresher.cancelled():
            # The page must say it stopped updating rather than keep showing the last numbers as live.
            raise web.HTTPInternalServerError(
                text=f"the dashboard's refresh task died: {refresher.exception()!r}"
            )
        return web.json_response(dashboard.state, headers={"Cache-Control": "no-store"})

    app = web.Application()
    app.add_routes(
        [web.get("/", index), web.get("/api/state", api_state), web.static("/static", str(page.STATIC))]
    )
    return app


@contextlib.asynccontextmanager
async def serving(dashboard: Dashboard, port: int) -> AsyncIterator[str]:
    """Serve the dashboard on 127.0.0.1:`port` (0 = any free port) while the block runs; yields its URL."""
    await dashboard.refresh()
    runner = web.AppRunner(make_app(dashboard), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"cannot listen on {LOOPBACK}:{port}: {exc.strerror}",
            fix="pass another --port" if exc.errno == errno.EADDRINUSE else "check the port number",
        ) from exc
    bound = runner.addresses[0][1]
    refresher = asyncio.create_task(dashboard.refresh_forever())
    dashboard.refresher = refresher
    try:
        yield f"http://{LOOPBACK}:{bound}/"
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher
        await runner.cleanup()
        dashboard.close()
