"""`fleetgen bench`: a concurrency sweep per instance and for the whole fleet, as a table, JSON or PNG.

The sweep lives in `fleetgen.bench.sweep` (endpoints: `bench_fleet`); this module parses options, prints,
and draws the PNG with the dashboard's chart renderer (`dashboard.svg`, rasterised by `dashboard.chromium`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.bench.fleet import SCOPES, bench_fleet, compare_spec
from fleetgen.bench.stats import DEFAULT_CONCURRENCIES, BenchLoad, LevelResult, SpeedupRow
from fleetgen.cli.servers import FleetFileServers, ServerSource, read_servers
from fleetgen.config import load_job
from fleetgen.dashboard import chromium, svg
from fleetgen.errors import ConfigError
from fleetgen.generate.work import SamplingParams
from fleetgen.http.request import GREEDY, Sampling

Opt = typer.Option


def parse_levels(text: str) -> tuple[int, ...]:
    """`1,8,32` → (1, 8, 32); a clear error otherwise."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        levels = ()
    if not levels or any(c < 1 for c in levels):
        raise ConfigError(
            f"--concurrency {text!r} is not a list of positive integers",
            fix="write it like --concurrency 1,8,32,128",
        )
    return levels


def throughput_chart(levels: Sequence[LevelResult], title: str) -> str:
    """Output tok/s against concurrency (log2 x), one line per target: the SVG `--png` rasterises."""
    series = [
        svg.Series(
            target, sorted((math.log2(r.concurrency), r.output_tok_s) for r in levels if r.target == target)
        )
        for target in dict.fromkeys(r.target for r in levels)
    ]
    ticks = [(math.log2(c), f"c={c}") for c in sorted({r.concurrency for r in levels})]
    return svg.line_chart(series, title=f"output tok/s vs concurrency per instance · {title}", x_ticks=ticks)


def _progress(level: LevelResult) -> None:
    failed = f", [red]{level.num_failed} failed[/]" if level.num_failed else ""
    ttft = f"{level.ttft_s.p50 * 1000:.0f} ms" if level.ttft_s else "—"
    cli.err_console.print(
        f"[dim]{level.target} c={level.concurrency}:[/] {level.output_tok_s:,.0f} tok/s, "
        f"{level.requests_s:.2f} req/s, TTFT p50 {ttft}{failed}",
        highlight=False,
    )


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f}" if value >= 0.1 else f"{value * 1000:.2f}"


def level_table(levels: Sequence[LevelResult], title: str) -> Table:
    columns = "target|conc|ok/fail|out tok/s|req/s|TTFT ms p50|p90|p99|ITL ms p50|p90|p99|accept"
    grid = cli.table(columns, numbers=True, no_wrap=True, title=title)
    for r in levels:
        times = [_ms(getattr(stats, p, None)) for stats in (r.ttft_s, r.itl_s) for p in ("p50", "p90", "p99")]
        accept = f"{r.accept_length:.2f}" if r.accept_length is not None else "—"
        counts = [str(r.concurrency), f"{r.num_requests - r.num_failed}/{r.num_failed}"]
        grid.add_row(r.target, *counts, f"{r.output_tok_s:,.0f}", f"{r.requests_s:.2f}", *times, accept)
    return grid


def speedup_table(rows: Sequence[SpeedupRow]) -> Table:
    grid = cli.table(
        "target|conc|off tok/s|on tok/s|speedup|accept", numbers=True, title="speculative decoding: on vs off"
    )
    for r in rows:
        accept = f"{r.accept_length:.2f}" if r.accept_length is not None else "—"
        tok_s = [f"{r.off_tok_s:,.0f}", f"{r.on_tok_s:,.0f}", f"{r.speedup:.2f}×"]
        grid.add_row(r.target, str(r.concurrency), *tok_s, accept)
    return grid


@cli.app.command()
def bench(
    fleet_path: Path = cli.FLEET_OPTION,
    endpoint: cli.Endpoints = None,
    input_len: int = Opt(1024, "--input-len", min=1, help="Prompt tokens per request."),
    output_len: int = Opt(1024, "--output-len", min=1, help="Output tokens per request (ignore_eos)."),
    concurrency: str = Opt(
        ",".join(map(str, DEFAULT_CONCURRENCIES)),
        "--concurrency",
        "-c",
        help="Levels per instance, e.g. 1,8,32.",
    ),
    max_concurrency: int | None = Opt(
        None,
        "--max-concurrency",
        min=1,
        help="Cap the levels (the plan's max running requests caps them too).",
    ),
    rounds: int = Opt(2, "--rounds", min=1, help="Requests per level = rounds × concurrency."),
    scope: str = Opt("both", "--scope", help="instances, fleet or both."),
    model: str | None = Opt(None, "--model", help="Model name; default: the server's first."),
    thinking: bool | None = cli.flag(
        "thinking", "Chat template thinking on/off (default: the job file's, else on).", None
    ),
    job_path: Annotated[
        Path | None,
        Opt(
            "--job",
            help="Job file (TOML): sample as `fleetgen run --job` does (default: greedy); lengths stay.",
        ),
    ] = None,
    compare: bool = cli.flag(
        "compare-spec", "Deploy spec decoding off, then on (as the fleet file says); print the speedup."
    ),
    as_json: bool = cli.flag("json", "Print JSON instead of tables."),
    png: Annotated[
        Path | None,
        Opt("--png", help="Write tok/s vs concurrency per instance to this PNG (needs Chromium)."),
    ] = None,
) -> None:
    """Measure output tok/s, req/s, TTFT, ITL and spec accept length over a concurrency sweep."""
    picked = next((s for s in SCOPES if s == scope), None)
    if picked is None:
        raise typer.BadParameter(f"--scope is one of: {', '.join(SCOPES)}")
    if compare and endpoint:
        raise typer.BadParameter("--compare-spec deploys the fleet twice: use --fleet, not --endpoint")

    lengths = f"in {input_len} / out {output_len} tokens"

    async def go() -> None:
        if png is not None:
            chromium.require_chromium()  # before the sweep, not after minutes of it
        sampling, job_model = sampling_of(job_path, thinking, model)
        load = BenchLoad(
            input_len,
            output_len,
            parse_levels(concurrency),
            rounds,
            model=job_model,
            sampling=sampling,
        )

        async def sweep_on(source: ServerSource) -> list[LevelResult]:
            async with source.for_bench() as servers:
                return await bench_fleet(servers, load, scope=picked, cap=max_concurrency, on_level=_progress)

        rows: list[SpeedupRow] = []
        if compare:  # refused with --endpoint
            off, on, rows = await compare_spec(
                cli.read_fleet(fleet_path), lambda fleet: sweep_on(FleetFileServers(fleet))
            )
            levels = [dataclasses.replace(r, target=f"{r.target} (spec off)") for r in off] + list(on)
        else:
            levels = await sweep_on(read_servers(fleet_path, endpoint))
        if as_json:
            sent = {**dataclasses.asdict(load), "sampling": load.sampling_sent()}
            cli.print_json({"load": sent, "levels": levels, "speedups": rows})
        else:
            cli.console.print(level_table(levels, f"fleetgen bench: {lengths}"))
            if rows:
                cli.console.print(speedup_table(rows))
        if png is not None:
            chromium.svg_to_png(throughput_chart(levels, lengths), png)
            cli.err_console.print(f"wrote {png}", highlight=False, markup=False)

    cli.execute(go())


def sampling_of(
    job_path: Path | None, thinking: bool | None, model: str | None = None
) -> tuple[Sampling, str | None]:
    """The sweep's sampling and the job's model: the job file's, exactly as `run` samples it
    (`SamplingParams.sampling`; `--thinking` and `--model` override it, as flags override it in `run`), or
    greedy and `--model` without one."""
    if job_path is None:
        return dataclasses.replace(GREEDY, thinking=False if thinking is False else None), model
    job_file = load_job(job_path).overridden(thinking=thinking, model=model)
    return SamplingParams.of(job_file).sampling, job_file.model
