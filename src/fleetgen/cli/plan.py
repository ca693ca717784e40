"""`fleetgen plan`: GPU memory and engine flags per instance, checked before anything launches."""

from __future__ import annotations

import shlex
from itertools import zip_longest
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.cli.jobplan import (
    InputOption,
    JobFileOption,
    OutputLengthsOption,
    job_table,
    print_issues,
    read_job_shape_for,
)
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.fleet.planning import plan_from_file
from fleetgen.plan import FleetPlan, InstancePlan
from fleetgen.plan.types import GIB


@cli.app.command("plan")
def plan(
    fleet_path: Path = cli.FLEET_OPTION,
    offline: bool = cli.flag("offline", "Use only the fleet file and local model folders."),
    target: int | None = typer.Option(
        None,
        "--target-concurrency",
        min=1,
        help="Solve for the flags giving N concurrent requests per instance.",
    ),
    job_path: JobFileOption = None,
    input_path: InputOption = None,
    output_lengths: OutputLengthsOption = None,
    as_json: bool = cli.flag("json", 'Print {"instances": [...]} as JSON.'),
) -> None:
    """Plan GPU memory and flags per instance. Exit code 2 when an instance does not fit or a rule fails.

    With --job and --input, plan for that job: how many of its requests each instance runs, what bounds them,
    and the engine's throughput settings ranked (`fleetgen tune` measures them)."""

    async def work(loaded: Fleet) -> FleetPlan:
        job_shape = await read_job_shape_for(loaded, job_path, input_path, output_lengths, offline=offline)
        return await plan_from_file(loaded.file, loaded.path, offline=offline, target=target, job=job_shape)

    result = cli.execute_on(fleet_path, work)
    if as_json:
        cli.print_json(result.to_json())
    else:
        _render(result)
    if not result.fits:
        cli.exit_with(2)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def _title(group: list[InstancePlan]) -> str:
    p = group[0]
    if len(group) == 1:
        return f"{p.instance}  ({p.host}, GPU {','.join(map(str, p.gpus))}, port {p.port}, {p.rules})"
    gpus = " ".join(",".join(map(str, g.gpus)) for g in group)
    ports = f"{group[0].port}–{group[-1].port}"
    where = f"{p.host}, GPUs {gpus}, ports {ports}, {p.rules}"
    return f"{p.instance} … {group[-1].instance}: {len(group)} identical instances  ({where})"


def _memory_table(p: InstancePlan, title: str) -> Table:
    """The figures every engine has, and the engine's own rows (`MemoryExtras`) in its own words."""
    m = p.memory
    table = cli.table("memory (per GPU)|GiB|capacity|", title=title, title_justify="left")
    for column in table.columns[1::2]:  # the numbers: GiB, and each capacity figure
        column.justify = "right"
    own = [(label, _gib(n)) for label, n in m.extras.memory_rows()]
    memory = [
        ("free at start", _gib(m.free_bytes)),
        ("static budget", _gib(m.budget_bytes)),
        ("weights", _gib(m.weights_bytes)),
        *own,
        ("KV pool", _gib(m.kv_pool_bytes)),
        ("headroom (est. need)", f"{_gib(m.headroom_bytes)} ({_gib(m.headroom_needed_bytes)})"),
    ]
    fits = "yes" if m.kv_tokens >= m.context_length else "NO"
    capacity = [
        *m.extras.capacity_rows(),
        ("KV bytes / token", f"{m.kv_bytes_per_token:,}"),
        ("state bytes / request", f"{m.state_bytes_per_request:,}"),
        ("KV tokens", f"{m.kv_tokens:,}"),
        ("max running requests", str(m.max_running_requests)),
        ("context / full request fits", f"{m.context_length:,} / {fits}"),
    ]
    for left, right in zip_longest(memory, capacity, fillvalue=("", "")):
        table.add_row(*left, *right)
    return table


def _render_group(group: list[InstancePlan]) -> None:
    """One table for instances whose plans differ only in GPU and port (a node of identical GPUs)."""
    p = group[0]
    cli.console.print(_memory_table(p, _title(group)))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(p.env.items()))
    label = "launch:" if len(group) == 1 else f"launch ({p.instance}; the others differ in GPU and port):"
    cli.console.print(
        f"  [dim]{escape(label)}[/] {escape(env)} {escape(shlex.join(p.argv))}",
        highlight=False,
        soft_wrap=True,
    )
    print_issues(p.errors, p.warnings)
    if p.job is not None:
        cli.console.print(job_table(p.job))
    for rank, fix in enumerate(p.fixes, 1):
        cli.console.print(f"  [green]fix {rank}[/] (cost {fix.cost}): {escape(fix.change)}", highlight=False)
    verdict = "[green]fits[/]" if p.fits else "[bold red]does not fit / refused[/]"
    cli.console.print(f"  verdict: {verdict}\n")


def _render(result: FleetPlan) -> None:
    groups: dict[str, list[InstancePlan]] = {}
    for p in result.instances:
        groups.setdefault(repr((p.host, p.rules, p.memory, p.errors, p.warnings, p.fixes)), []).append(p)
    for group in groups.values():
        _render_group(group)
    print_issues(result.errors, result.warnings)
    total = sum(i.memory.max_running_requests for i in result.instances if i.fits)
    state = "[green]all instances fit[/]" if result.fits else "[bold red]the plan fails (exit 2)[/]"
    cli.console.print(f"{len(result.instances)} instance(s), {total} concurrent requests in total: {state}")
