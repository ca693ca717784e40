"""`fleetgen up / down / restart / status / logs`: deploy, verify and watch the fleet's servers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.cli.jobplan import (
    InputOption,
    JobFileOption,
    OutputLengthsOption,
    admission_line,
    admitted_of,
    print_job_plans,
    read_job_shape_for,
)
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down as do_down
from fleetgen.deploy.fleetops import up as do_up
from fleetgen.deploy.logs import read_log
from fleetgen.deploy.readiness import Readiness
from fleetgen.deploy.types import Outcome
from fleetgen.fleet.status import InstanceStatus, fleet_status, open_view
from fleetgen.plan import InstancePlan
from fleetgen.plan.types import JobPlan

ONLY_OPTION = typer.Option(None, "--only", help="Instance or host names (repeatable); default: all.")


def _progress(instance: str, message: str) -> None:
    cli.err_console.print(f"[dim]{escape(instance)}:[/] {escape(message)}", highlight=False)


def _report(outcomes: Sequence[Outcome], verb: str, jobs: Mapping[str, JobPlan] | None = None) -> None:
    """Print one block per instance, one per error that failed several (a fleet-wide refusal names them all
    once), and for an instance planned for a job (`jobs`), its running requests planned next to what the
    engine admits; exit 1 when one failed."""
    failed = 0
    shown: set[int] = set()
    for out in sorted(outcomes, key=lambda o: o.instance):
        if out.error is not None:
            failed += 1
            if id(out.error) not in shown:
                shown.add(id(out.error))
                same = sorted(o.instance for o in outcomes if o.error is out.error)
                where = ", ".join(sorted({o.host for o in outcomes if o.error is out.error}))
                cli.err_console.print(f"[bold red]✗ {', '.join(same)}[/] ({where}) failed:", highlight=False)
                cli.render_error(out.error)
            continue
        action = out.action.value if out.action else verb
        facts = [
            f"pid {out.pid}" if out.pid else "",
            out.url,
            f"{out.elapsed_s:.1f}s" if out.elapsed_s else "",
            f"swept pid(s) {', '.join(map(str, out.swept))} left on the node" if out.swept else "",
        ]
        line = ", ".join([f"[green]✓ {out.instance}[/] ({out.host}) {action}", *filter(None, facts)])
        cli.console.print(line, highlight=False)
        _print_verified(out)
        job = (jobs or {}).get(out.instance)
        if job is not None and out.verified is not None:
            admitted = admitted_of(out.verified.capacity)
            cli.console.print("    " + escape(admission_line(job, admitted)), highlight=False)
    total = len(outcomes)
    style = "red" if failed else "green"
    cli.console.print(f"[{style}]{total - failed}/{total} {verb}[/]", highlight=False)
    if failed:
        cli.exit_with(1)


def _print_verified(out: Outcome) -> None:
    ver = out.verified
    if ver is None:
        return
    parts = [f"model {ver.model}"]
    if ver.spec_steps:
        parts.append(f"speculative decoding ran ({ver.spec_steps:,.0f} verify steps during the test request)")
    if ver.accept_length is not None:
        parts.append(f"spec accept length {ver.accept_length:.2f}")
    cli.console.print("    verified: " + escape(", ".join(parts)), highlight=False)
    for warning in ver.warnings:
        cli.console.print(f"    [yellow]warning:[/] {escape(warning)}", highlight=False)
    for row in ver.capacity:
        planned = "—" if row.planned is None else _figure(row.planned)
        actual = "—" if row.actual is None else _figure(row.actual)
        cli.console.print(f"    {row.what:<22} planned {planned:>12}   actual {actual:>12}", highlight=False)


def _figure(value: float) -> str:
    """A capacity figure: whole numbers as counts, vLLM's fractional concurrency (55.22x) with decimals."""
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


PLAN_CHECK_OPTION = cli.flag(
    "plan-check",
    "Start nothing when plan's rules say the engine refuses an instance's flags (its own rejections, "
    "not memory estimates).",
    True,
)


@cli.app.command()
def up(
    fleet_path: Path = cli.FLEET_OPTION,
    only: list[str] | None = ONLY_OPTION,
    plan_check: bool = PLAN_CHECK_OPTION,
    job_path: JobFileOption = None,
    input_path: InputOption = None,
    output_lengths: OutputLengthsOption = None,
) -> None:
    """Start (or leave running) every instance, wait until ready, and verify it.

    With --job and --input, up's plan is for that job (as `plan --job`): before launching it prints the
    job-throughput warning and the best setting (it launches the flags as written all the same), and after
    verifying each instance the job's running requests planned next to what the engine admits."""
    _deploy(fleet_path, only, plan_check, (job_path, input_path, output_lengths), force=False)


@cli.app.command()
def restart(
    fleet_path: Path = cli.FLEET_OPTION,
    only: list[str] | None = ONLY_OPTION,
    plan_check: bool = PLAN_CHECK_OPTION,
    job_path: JobFileOption = None,
    input_path: InputOption = None,
    output_lengths: OutputLengthsOption = None,
) -> None:
    """Stop and start every (selected) instance, then verify it (with --job and --input: as `up --job`)."""
    _deploy(fleet_path, only, plan_check, (job_path, input_path, output_lengths), force=True)


def _deploy(
    fleet_path: Path,
    only: list[str] | None,
    plan_check: bool,
    job: tuple[Path | None, Path | None, str | None],
    *,
    force: bool,
) -> None:
    """`up` (force: `restart`): the plan for the job where one is given, launch, verify, report."""
    jobs: dict[str, JobPlan] = {}

    async def work(loaded: Fleet) -> list[Outcome]:
        job_shape = await read_job_shape_for(loaded, *job, offline=False)

        def planned(plans: list[InstancePlan]) -> None:
            if job_shape is not None:
                print_job_plans(plans)
            jobs.update({p.instance: p.job for p in plans if p.job is not None})

        return await do_up(
            loaded,
            only=only,
            force=force,
            plan_check=plan_check,
            progress=_progress,
            job=job_shape,
            planned=planned,
        )

    _report(cli.execute_on(fleet_path, work), "ready", jobs)


@cli.app.command()
def down(fleet_path: Path = cli.FLEET_OPTION, only: list[str] | None = ONLY_OPTION) -> None:
    """Stop every (selected) instance."""
    _report(cli.execute_on(fleet_path, lambda f: do_down(f, only=only)), "stopped")


def _table(statuses: Sequence[InstanceStatus]) -> Table:
    grid = cli.table(
        "instance|host|gpus|pid|url|ready|up|run|queue|tok/s|accept|KV|problem", box=None, pad_edge=False
    )
    for s in statuses:
        grid.add_row(
            s.instance,
            s.placement if s.placement and s.pid else s.host,  # a Slurm job that runs: its job and node
            ",".join(map(str, s.gpus)),
            str(s.pid or "—"),
            s.url or "—",
            "[green]yes[/]" if s.readiness is Readiness.READY else "[red]no[/]",
            _fmt(s.uptime_s, "{:.0f}s"),
            _fmt(s.running),
            _fmt(s.queued),
            _fmt(s.gen_tokens_per_s, "{:.1f}"),
            _fmt(s.spec_accept_length, "{:.2f}"),
            _fmt(None if s.kv_usage is None else s.kv_usage * 100, "{:.0f}%"),
            escape("; ".join([s.problem, *s.drift]).strip("; ")),
        )
    return grid


def _fmt(value: float | int | None, pattern: str = "{}") -> str:
    return "—" if value is None else pattern.format(value)


@cli.app.command()
def status(
    fleet_path: Path = cli.FLEET_OPTION,
    only: list[str] | None = ONLY_OPTION,
    as_json: bool = cli.flag("json", "Print a JSON list, one object per instance."),
    watch: bool = cli.flag("watch", "Refresh every few seconds until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch."),
) -> None:
    """Re-read every instance from its host: process, drift, health, load, accept length, and whether it
    answers a one-token chat request (a server failing every request is down, whatever /health says)."""
    if not watch:
        statuses = cli.execute_on(fleet_path, lambda f: fleet_status(f, only=only, probe=True))
        if as_json:
            cli.print_json([s.to_json() for s in statuses])
        else:
            cli.console.print(_table(statuses))
        if any(s.readiness is not Readiness.READY for s in statuses):
            cli.exit_with(1)
        return
    cli.execute(cli.until_stopped(_watch(fleet_path, only, as_json, interval)))


async def _watch(fleet_path: Path, only: list[str] | None, as_json: bool, interval: float) -> None:
    async with open_view(cli.read_fleet(fleet_path), only=only, probe=True) as view:
        while True:
            statuses = await view.refresh(rate_window_s=0)
            if as_json:
                cli.print_json([s.to_json() for s in statuses], indent=None)
            else:
                cli.console.clear()
                cli.console.print(_table(statuses))
            await asyncio.sleep(interval)


@cli.app.command()
def logs(
    name: str = typer.Argument(..., help="Instance name (`fleetgen status` lists them)."),
    # `-f` is --follow here (as in `tail -f`), so the fleet file is --fleet only.
    fleet_path: Annotated[Path, typer.Option("--fleet", help="The fleet file (TOML).")] = Path("fleet.toml"),
    follow: bool = cli.flag("follow", "Keep printing new lines.", short="-f"),
    lines: int = typer.Option(100, "--lines", "-n", min=0, help="How many lines of the end to show."),
) -> None:
    """Show an instance's current log (the launch in progress or running)."""

    async def show() -> None:
        async for line in read_log(cli.read_fleet(fleet_path), name, lines, follow=follow):
            print(line, flush=True)

    cli.execute(cli.until_stopped(show()) if follow else show())
