"""`fleetgen run`: resumable, exactly-once generation (`fleetgen export` is `cli/export.py`).

The live view renders the job's progress snapshots on stderr (stdout stays clean for `--json`); Ctrl-C once
stops taking work and lets in-flight requests finish, twice abandons them. Nothing half-written either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NamedTuple

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.cli.runlog import PlainLog, progress_line
from fleetgen.cli.runoptions import JobFlags, RunOptions
from fleetgen.cli.servers import Servers, ServerSource, read_servers
from fleetgen.config import JobFile, load_job
from fleetgen.deploy.readiness import Readiness
from fleetgen.errors import FleetDown
from fleetgen.generate.jobshape import read_job_shape
from fleetgen.generate.progress import Progress, RunEnd, Summary
from fleetgen.generate.runner import Job
from fleetgen.generate.work import JobOptions, RecordShape, RetryPolicy, SamplingParams
from fleetgen.plan.throughput import max_length_issue

DEFAULT_CONCURRENCY = 64
EXIT_CODES: dict[RunEnd, int] = {
    "stopped": 130,
    "failed": 1,
}  # failed: nothing useful was produced, so never exit 0
READINESS_STYLE = {Readiness.READY: "{}", Readiness.WAITING: "[yellow]{}[/]", Readiness.DOWN: "[red]{}[/]"}
Opt = typer.Option
NO_MODEL_DIR = (
    "[yellow]note[/]: no chat template is recorded (no model folder holding one was known to this run): "
    "`fleetgen export --format specforge-tokens` needs --model-dir "
    "(set model_dir in the job file to record it)"
)


def render(progress: Progress) -> Table:
    """The live view: the plain log's line of totals (`runlog.progress_line`), one row per endpoint."""
    head = escape(progress_line(progress))
    if progress.stopping:
        head += "  [yellow]stopping: finishing in-flight requests (Ctrl-C again to abandon them)[/]"
    if progress.waiting_s is not None and not progress.is_final:
        head = (
            f"[yellow]no server is ready[/]: waiting up to {progress.waiting_s:.0f} s more for one, then the "
            "job stops (`fleetgen up` brings them up; `fleetgen status` says why)"
        )
    grid = cli.table("instance|state|in flight|done|compl/s|last error", title=head, title_justify="left")
    for e in progress.endpoints:
        grid.add_row(
            e.name,
            READINESS_STYLE[e.readiness].format(e.readiness.value),
            f"{e.in_flight}/{e.cap}",
            str(e.completions),
            f"{e.completions_per_s:.1f}",
            escape(e.last_error[:60]),
        )
    return grid


@cli.app.command("run")
def run_command(
    input_path: Annotated[Path, typer.Argument(help="Prompts: JSONL, Parquet, or a datasets folder.")],
    out: Annotated[Path, Opt("--out", "-o", help="Output folder; running again resumes.")],
    fleet_path: cli.FleetOrNone = None,
    endpoint: cli.Endpoints = None,
    job_path: Annotated[Path | None, Opt("--job", help="Job file (TOML); flags override it.")] = None,
    # The flags over the job file's fields: each is checked by the field's own rule (`JobFile.overridden`),
    # not by a second copy of it here.
    concurrency: Annotated[int | None, Opt("--concurrency", help="In-flight requests per server.")] = None,
    max_tokens: Annotated[int | None, Opt("--max-tokens")] = None,
    temperature: Annotated[float | None, Opt("--temperature")] = None,
    top_p: Annotated[float | None, Opt("--top-p")] = None,
    top_k: Annotated[int | None, Opt("--top-k")] = None,
    seed: Annotated[int | None, Opt("--seed")] = None,
    samples: Annotated[int | None, Opt("--samples", help="Samples per record.")] = None,
    thinking: bool | None = cli.flag(
        "thinking", "enable_thinking on/off (default: the job file's, else on).", None
    ),
    retry_errors: bool = cli.flag("retry-errors", "Re-run only the error rows."),
    redo_truncated: bool = cli.flag("redo-truncated", "Re-run only truncated rows."),
    force_params: bool = cli.flag("force-params", "Resume despite other sampling params."),
    add_input: bool = cli.flag(
        "add-input", "Run this input into a folder made from another (it holds both)."
    ),
    restart_dead: bool = cli.flag("restart-dead", "Restart dead instances (fleet file)."),
    max_retries: Annotated[int | None, Opt("--max-retries")] = None,
    dead_timeout: Annotated[
        float | None,
        Opt(
            "--dead-timeout",
            min=0.0,
            help="Every server gone mid-job: stop after this long (s) "
            "(default: --wait-ready's; 300 with --endpoint).",
        ),
    ] = None,
    wait_ready: Annotated[
        float | None,
        Opt(
            "--wait-ready",
            min=0.0,
            help="No server ready (at the start, or every one gone mid-job): wait this "
            "long (s) for one, then stop with FleetDown (default: the fleet's engine.ready_timeout_s; with "
            "--endpoint 0 at the start).",
        ),
    ] = None,
    hung_after: Annotated[
        float,
        Opt(
            "--hung-after",
            min=1.0,
            help="A server with requests in flight and no progress this long (s: no answer, its engine's "
            "counters still; without /metrics, /health failing too) is hung, whatever /health says: its "
            "requests go elsewhere.",
        ),
    ] = 120.0,
    split: Annotated[str | None, Opt("--split", help="Split of a DatasetDict folder.")] = None,
    json_out: bool = cli.flag("json", "Print the summary as JSON."),
    live: bool = cli.flag(
        "live", "The live view on a terminal (--no-live: plain log lines, as off one).", True
    ),
    log_every: Annotated[
        float, Opt("--log-every", min=1.0, help="Off a terminal (or --no-live): a progress line every S s.")
    ] = 30.0,
) -> None:
    """Generate completions for every (record, sample) exactly once, across all servers; resumable."""
    flags = JobFlags(
        concurrency=concurrency,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        samples=samples,
        thinking=thinking,
        max_retries=max_retries,
    )
    options = RunOptions(
        input_path=input_path,
        out=out,
        fleet_path=fleet_path,
        endpoints=tuple(endpoint or ()),
        job_path=job_path,
        flags=flags,
        retry_errors=retry_errors,
        redo_truncated=redo_truncated,
        force_params=force_params,
        add_input=add_input,
        restart_dead=restart_dead,
        dead_timeout_s=dead_timeout,
        wait_ready_s=wait_ready,
        hung_after_s=hung_after,
        split=split,
        live=live,
        log_every_s=log_every,
    )
    summary, recorded = cli.execute(run_job(options))
    _print_summary(summary, json_out)
    if not recorded and summary.results:
        cli.err_console.print(NO_MODEL_DIR, highlight=False)
    if summary.status in EXIT_CODES:
        raise typer.Exit(EXIT_CODES[summary.status])


class JobRun(NamedTuple):
    """What `run_job` ends with: the summary, and whether the chat template the server applied is recorded."""

    summary: Summary
    template_recorded: bool


async def run_job(opts: RunOptions) -> JobRun:
    """`fleetgen run` whole, once its command line is read: the job file with the flags over it, on the
    servers held for the job, to its end (the summary; `FleetDown` says how to resume)."""
    opts.refuse_conflicts()
    job_file = (load_job(opts.job_path) if opts.job_path else JobFile()).overridden(
        **dataclasses.asdict(opts.flags)
    )
    source = read_servers(opts.fleet_path, opts.endpoints)
    model_dir = await _model_dir(job_file, opts.job_path, source)
    await _warn_past_max_length(job_file, opts.input_path, model_dir, opts.split)
    async with source.for_job(opts.wait_ready_s, opts.restart_dead) as servers:
        on = (
            servers.of_job
            if job_file.concurrency
            else dataclasses.replace(servers.of_job, caps=servers.caps, fill=servers.fill)
        )
        job = Job(_job_options(opts, job_file, servers, model_dir), on)
        summary = await _run_job(job, servers.meanwhile, opts.live, opts.log_every_s)
    return JobRun(summary, template_recorded=model_dir is not None)


def _job_options(opts: RunOptions, job_file: JobFile, servers: Servers, model_dir: Path | None) -> JobOptions:
    """The job's own settings (`JobOptions`) from the command line, the job file and its servers' defaults."""
    return JobOptions(
        input_path=opts.input_path,
        out_dir=opts.out,
        params=SamplingParams.of(job_file),
        shape=RecordShape.of(job_file),
        concurrency=job_file.concurrency or max(servers.caps.values(), default=DEFAULT_CONCURRENCY),
        policy=RetryPolicy(
            max_retries=job_file.max_retries,
            max_consecutive_failures=job_file.max_consecutive_failures,
            dead_timeout_s=servers.dead_timeout_s if opts.dead_timeout_s is None else opts.dead_timeout_s,
            hung_after_s=opts.hung_after_s,
        ),
        request_timeout_s=job_file.request_timeout_s,
        mode=opts.mode,
        force_params=opts.force_params,
        add_input=opts.add_input,
        split=opts.split,
        wait_ready_s=servers.wait_s,
        model_dir=model_dir,
        max_length=job_file.max_length,
    )


async def _model_dir(job_file: JobFile, job_path: Path | None, source: ServerSource) -> Path | None:
    """The model folder whose chat template the run records: the job file's `model_dir` (relative to it),
    else the source's (`ServerSource.model_dir`: a fleet's where it holds a template); None with bare URLs or
    a fleet whose folder holds none (said after the summary, `NO_MODEL_DIR`: the job runs)."""
    if job_file.model_dir is not None:
        return _relative_to(job_path, job_file.model_dir)
    return await source.model_dir()


def _relative_to(job_path: Path | None, folder: str) -> Path:
    return ((job_path.parent if job_path else Path()) / Path(folder).expanduser()).resolve()


async def _warn_past_max_length(
    job_file: JobFile, input_path: Path, model_dir: Path | None, split: str | None
) -> None:
    """With the job's `max_length` set: the input's longest prompt (read as `plan --job` reads it) plus
    max_tokens past it is said with the numbers, before anything is generated."""
    if job_file.max_length is None:
        return
    shape = await asyncio.to_thread(
        read_job_shape, job_file, input_path, tokenizer_dir=model_dir, output_lengths=None, split=split
    )
    issue = max_length_issue(shape)
    if issue is not None:
        rule = escape(f"[{issue.rule}]")
        cli.err_console.print(f"[yellow]warning[/] {rule} {escape(issue.message)}", highlight=False)
        cli.err_console.print(f"  [green]fix:[/] {escape(issue.fix)}", highlight=False)


async def _run_job(job: Job, meanwhile: Callable[[float], str], live: bool, log_every: float) -> Summary:
    def on_signal() -> None:
        job.stop()
        cli.err_console.print(
            "[yellow]stopping[/]: no new work; in-flight requests finish (Ctrl-C again to abandon)"
        )

    try:
        with cli.on_stop(on_signal):
            if not (live and cli.err_console.is_terminal):  # off a terminal: a log, not a redrawn frame
                say = functools.partial(cli.err_console.print, markup=False, highlight=False)
                return await job.run(PlainLog(say, every_s=log_every, meanwhile=meanwhile))
            with Live(console=cli.err_console, refresh_per_second=2, transient=False) as view:
                return await job.run(lambda progress: view.update(render(progress)))
    except FleetDown as exc:
        exc.context["resume"] = shlex.join(["fleetgen", *sys.argv[1:]])
        raise


def _print_summary(summary: Summary, json_out: bool) -> None:
    if json_out:
        cli.print_json({**dataclasses.asdict(summary), "completions_per_s": summary.completions_per_s})
        return
    cli.console.print(
        f"[bold]{summary.status}[/]: {summary.completions_this_run} completions this run in "
        f"{summary.elapsed_s:.1f} s ({summary.completions_per_s:.1f}/s, "
        f"{summary.output_tokens_this_run} output tokens); the store holds {summary.results} results, "
        f"{summary.errors} errors, {summary.truncated} truncated, {summary.bad_inputs} bad input lines "
        f"— {escape(str(summary.out_dir))}"
    )
    for bad in summary.bad_input_samples:
        cli.console.print(f"  bad input {bad.source}:{bad.line}: {bad.reason}", highlight=False, markup=False)
    if summary.bad_inputs > len(summary.bad_input_samples):
        cli.console.print(
            f"  … and {summary.bad_inputs - len(summary.bad_input_samples)} more (table inputs_bad)"
        )
    if summary.errors:
        cli.console.print(f"  {summary.errors} error rows: see table errors; rerun with --retry-errors")
    if summary.status == "failed":
        cli.err_console.print(
            "[bold red]error:[/] the job produced no result: every work item is an error row or bad input, "
            "or the input holds no record (see the lines above)",
            highlight=False,
        )
