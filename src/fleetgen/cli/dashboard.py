"""`fleetgen dashboard` (a live local web page) and `fleetgen report` (one self-contained HTML file)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer

import fleetgen.cli.app as cli
from fleetgen.cli.servers import read_servers
from fleetgen.dashboard.report import write_report
from fleetgen.dashboard.server import Dashboard, FleetSource, no_fleet, serving
from fleetgen.errors import ConfigError

Opt = typer.Option


@contextlib.asynccontextmanager
async def _fleet_source(
    fleet_path: Path | None, endpoints: list[str]
) -> AsyncIterator[tuple[FleetSource, str]]:
    """The fleet rows' source (and a standing note): the servers' (`ServerSource.for_dashboard`), or none."""
    if fleet_path is None and not endpoints:
        yield no_fleet, ""
        return
    async with read_servers(fleet_path, endpoints).for_dashboard() as (source, note):
        yield source, note


async def _serve(fleet_path: Path | None, out: Path | None, endpoints: list[str], port: int) -> None:
    if fleet_path is None and out is None and not endpoints:
        raise ConfigError(
            "nothing to show: no fleet file, no job folder and no endpoint",
            fix="pass -f fleet.toml and/or -o OUT_DIR (or --endpoint URL)",
        )
    async with _fleet_source(fleet_path, endpoints) as (source, note):
        where = " · ".join(str(p) for p in (out, fleet_path if not endpoints else None) if p) or "fleet"
        dashboard = Dashboard(out, source, where, notes=[note])
        async with serving(dashboard, port) as url:
            cli.err_console.print(f"dashboard: [bold]{url}[/] (Ctrl-C to stop)", highlight=False)
            bound = urlsplit(url).port  # with --port 0, the one the system picked
            cli.err_console.print(
                f"  from another machine: ssh -L {bound}:127.0.0.1:{bound} THIS_HOST, then open {url}",
                highlight=False,
            )
            await asyncio.Event().wait()  # serve until Ctrl-C (`until_stopped` cancels this)


@cli.app.command("dashboard")
def dashboard_command(
    fleet_path: cli.FleetOrNone = None,
    out: Annotated[Path | None, Opt("--out", "-o", help="The job's output folder (`run -o`).")] = None,
    endpoint: cli.Endpoints = None,
    port: Annotated[int, Opt("--port", min=0, max=65535, help="Port on 127.0.0.1 (0: any free one).")] = 8765,
) -> None:
    """Serve a live page on 127.0.0.1: the fleet's health and load, the job's progress and charts."""
    if fleet_path is None and Path("fleet.toml").exists() and not endpoint:
        fleet_path = Path("fleet.toml")
    cli.execute(cli.until_stopped(_serve(fleet_path, out, endpoint or [], port)))


@cli.app.command("report")
def report_command(
    out_dir: cli.JobFolder,
    to: Annotated[Path | None, Opt("--to", help="The HTML file (default: OUT_DIR/report.html).")] = None,
    png: bool = cli.flag("png", "Also write one PNG per chart (needs Chromium)."),
) -> None:
    """Write one self-contained HTML report of a finished or running job (and PNGs with --png)."""
    files = cli.execute(write_report(out_dir, to, png=png))
    job = files.job
    total = f"/{job.total:,}" if job.total is not None else ""
    cli.console.print(
        f"report: {files.html} — {job.done:,}{total} done, {job.num_errors:,} errors, "
        f"{job.num_truncated:,} truncated",
        highlight=False,
        markup=False,
    )
    for path in files.pngs:
        cli.console.print(f"  {path}", highlight=False, markup=False)
