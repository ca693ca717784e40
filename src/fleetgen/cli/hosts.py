"""`fleetgen hosts check`: probe every host of a fleet (reachable, GPUs, RAM, disk, python, engine, model)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.fleet.hostcheck import HostReport, check_hosts

hosts_app = typer.Typer(help="Inspect the hosts of a fleet.", no_args_is_help=True)
cli.app.add_typer(hosts_app, name="hosts")


@hosts_app.command("check")
def check(
    fleet_path: Path = cli.FLEET_OPTION,
    as_json: bool = cli.flag("json", "Print a JSON list, one object per host."),
) -> None:
    """Probe every host in parallel. Exit code 1 if any host is unreachable or lacks something."""
    reports = cli.execute_on(fleet_path, lambda loaded: check_hosts(loaded.file))
    for report in reports:
        for message in report.warnings:
            cli.warn(message)
    if as_json:
        cli.print_json(reports)
    else:
        cli.console.print(_table(reports))
        _print_problems(reports)
    if not all(report.is_ready for report in reports):
        cli.exit_with(1)


def _table(reports: list[HostReport]) -> Table:
    grid = cli.table("host|status|os|gpus|ram free/total|disk free|python|engine|model", title="hosts")
    for r in reports:
        if not r.reachable:
            grid.add_row(r.host, "[red]unreachable[/]", *[""] * 7)
            continue
        status = "[green]ready[/]" if r.is_ready else f"[yellow]{len(r.problems)} problem(s)[/]"
        ram = f"{r.mem_available_gib or 0:.0f}/{r.mem_total_gib or 0:.0f} GiB"
        disk = f"{r.disk_free_gib:.0f} GiB" if r.disk_free_gib is not None else "?"
        python = r.python_version if r.python_ok else "[red]missing[/]"
        engine = f"{r.engine} {r.engine_version}" if r.engine_version else f"[red]no {r.engine}[/]"
        model = "[green]present[/]" if r.model_present else "[red]missing[/]"
        grid.add_row(
            r.host, status, escape(r.os or "?"), escape(_gpus(r)), ram, disk, python or "?", engine, model
        )
    return grid


def _gpus(report: HostReport) -> str:
    if not report.gpus:
        return "none"
    names = sorted({gpu.name for gpu in report.gpus})
    used = sum(gpu.memory_used_mib for gpu in report.gpus)
    return f"{len(report.gpus)}× {', '.join(names)} ({used} MiB in use)"


def _print_problems(reports: list[HostReport]) -> None:
    for r in reports:
        if not r.reachable:
            cli.console.print(f"[bold red]{r.host}[/]: {escape(r.error or '')}", highlight=False)
            if r.fix:
                cli.console.print(f"  [bold green]fix:[/] {escape(r.fix)}", highlight=False)
        for problem in r.problems:  # texts quote `[[hosts]]`: escaped, or rich would read them as markup
            cli.console.print(f"[yellow]{r.host}[/]: {escape(problem)}", highlight=False)
