"""What `plan` and `up` share of planning for a job: its options in one place (`--job`, `--input`,
`--output-lengths`, parsed one way), the job's shape read from them, and the plan printed one way (its issues,
the job's settings table; for `up`, what the engine admits next to what the job was planned)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.config import load_job
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.verify import CapacityRow
from fleetgen.errors import ConfigError
from fleetgen.fleet.planning import tokenizer_dir_for
from fleetgen.generate.jobshape import output_lengths_of, read_job_shape
from fleetgen.plan import InstancePlan, Issue
from fleetgen.plan.job import JobShape
from fleetgen.plan.types import JobPlan

JobFileOption = Annotated[
    Path | None,
    typer.Option("--job", help="Plan for this job file (max_tokens, samples) over --input."),
]
InputOption = Annotated[
    Path | None,
    typer.Option("--input", help="The job's input (JSONL, Parquet, datasets folder): prompts measured."),
]
OutputLengthsOption = Annotated[
    str | None,
    typer.Option(
        "--output-lengths",
        help="Expected output lengths: an earlier run's folder, or mean=1800,min=300,max=6000 "
        "(default: max_tokens, the ceiling).",
    ),
]
# The engine's own reading of the running requests it admits (`Engine.capacity`), as `up` verified it.
ADMITTED = "max_running_requests"


async def read_job_shape_for(
    fleet: Fleet,
    job_path: Path | None,
    input_path: Path | None,
    lengths: str | None,
    *,
    offline: bool,
) -> JobShape | None:
    """The job's shape from `--job` and `--input` (both needed; neither: no job), counted with the model's
    tokenizer where one is readable (`fleet.planning.tokenizer_dir_for`)."""
    if job_path is None and input_path is None:
        return None
    if job_path is None or input_path is None:
        raise ConfigError("planning for a job needs both --job JOB_FILE and --input INPUT", fix="give both")
    tokenizer_dir = await tokenizer_dir_for(fleet.file, fleet.path, offline=offline)
    return await asyncio.to_thread(
        read_job_shape,
        load_job(job_path),
        input_path,
        tokenizer_dir=tokenizer_dir,
        output_lengths=output_lengths_of(lengths) if lengths else None,
    )


def print_issues(errors: Sequence[Issue], warnings: Sequence[Issue]) -> None:
    """A plan's errors and warnings, each with its rule and fix, as `plan` prints them (and `up --job`)."""
    for title, style, issues in (("error", "bold red", errors), ("warning", "yellow", warnings)):
        for issue in issues:
            cli.console.print(
                f"  [{style}]{title}[/] {escape(f'[{issue.rule}]')} {escape(issue.message)}", highlight=False
            )
            if issue.fix:
                cli.console.print(f"    [green]fix:[/] {escape(issue.fix)}", highlight=False)


def job_table(job: JobPlan, title: str = "for this job") -> Table:
    """The settings for the job, the user's first: running requests planned, what bounds them, memory used."""
    table = cli.table("setting|running|bound by|memory used|change", title=title, title_justify="left")
    for s in job.settings:
        note = f" [yellow](changes numerics: {escape(s.numerics)})[/]" if s.numerics else ""
        used = f"{s.used_share:.0%}"
        table.add_row(escape(s.name), str(s.running), escape(s.bound), used, escape(s.change or "—") + note)
    return table


def print_job_plans(plans: Sequence[InstancePlan]) -> None:
    """`up --job` before it launches: per set of instances planned alike for the job, its `job-throughput`
    warning and the job's table cut to what `up` launches (as-written) and the plan's best setting. The
    launch goes on: the flags are the user's. None planned: the model's shape was not read (up said why)."""
    if not plans:
        cli.warn("not planned for this job: the model's shape could not be read (see above)")
    groups: dict[str, tuple[JobPlan, list[str]]] = {}
    for p in plans:
        if p.job is not None:
            groups.setdefault(repr(p.job), (p.job, []))[1].append(p.instance)
    for job, names in groups.values():
        if job.warning is not None:
            print_issues((), (job.warning,))
        mine, best = job.as_written, job.best
        shown = JobPlan((mine,) if best is mine else (mine, best))
        title = f"for this job: {', '.join(names)} (up launches as-written; `fleetgen plan --job` ranks all)"
        cli.console.print(job_table(shown, title))
    if unplanned := [p.instance for p in plans if p.job is None]:
        cli.warn(f"{', '.join(unplanned)}: not planned for this job (`fleetgen plan --job` shows why)")


def admitted_of(capacity: Sequence[CapacityRow]) -> int | None:
    """The running requests the engine admits, as it reported them when `up` verified it (None: not read)."""
    actual = next((row.actual for row in capacity if row.what == ADMITTED), None)
    return None if actual is None else int(actual)


def admission_line(job: JobPlan, admitted: int | None) -> str:
    """One instance after `up --job` verified it: the job's running requests planned for the flags it runs
    next to what the engine admits, and what bounds the plan's (the engine caps at what it admits)."""
    mine = job.as_written
    shown = "—" if admitted is None else f"{admitted:,}"
    line = f"{'for this job running':<22} planned {mine.running:>12,}   admitted {shown:>10}   ({mine.bound})"
    if admitted is not None and admitted < mine.running:
        line += f"; the engine admits {mine.running - admitted:,} fewer than planned"
    best = job.best
    if best.running > mine.running:
        line += f"; {best.name} plans {best.running:,}"
    return line
