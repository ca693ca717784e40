"""`fleetgen tune`: measure the job's candidate settings on the fleet's own GPUs and write the winners as a
new fleet file (`fleetgen.tune.session` does the work; this module parses options and prints)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

import fleetgen.cli.app as cli
from fleetgen.config import JobFile, load_job
from fleetgen.dashboard import svg
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.errors import ConfigError
from fleetgen.generate.jobshape import output_lengths_of
from fleetgen.tune.measure import Load
from fleetgen.tune.session import TuneOptions, TuneResult, tune
from fleetgen.tune.verdict import Measured, ratio

Opt = typer.Option
UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """`20m`, `1h`, `90s`, `600` (seconds) → seconds; a clear error otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"--budget {text!r} is not a duration", fix="write it like 20m, 1h or 900s")
    return float(match.group(1)) * UNITS[match.group(2)]


def result_table(result: TuneResult) -> Table:
    columns = "GPU class|candidate|planned|engine|running|decode tok/s/GPU|compl/s|accept|× as-written|note"
    grid = cli.table(columns, numbers=True, title="fleetgen tune: each candidate at steady state")
    for m in result.measured:
        base = result.baselines.get(m.gpu_class)
        r = ratio(m, base)
        chosen = result.chosen.get(m.gpu_class) is m
        grid.add_row(
            m.gpu_class.name,
            ("[bold]" + m.setting.name + " ✓[/]") if chosen else m.setting.name,
            str(m.setting.running),
            str(m.admitted) if m.admitted is not None else "—",
            f"{m.running:.0f}" if m.running is not None else "—",
            f"{m.decode_tps_per_gpu:,.0f}" if m.is_ok else "—",
            f"{m.completions_per_s:.2f}",
            f"{m.accept_length:.2f}" if m.accept_length is not None else "—",
            f"{r:.2f}×" if r is not None else "—",
            m.error or "; ".join(m.notes),
        )
    return grid


def chart(result: TuneResult) -> str:
    """Decode tok/s per GPU of every candidate measured, each bar noted with its ratio to the fleet file's
    own settings and the running requests it ran (or why it has no rate), the chosen ones in the accent
    colour and named so."""
    one_class = len(result.classes) == 1
    bars = [
        svg.Bar(
            m.setting.name if one_class else f"{m.gpu_class.name} {m.setting.name}",
            m.decode_tps_per_gpu if m.is_ok else None,
            svg.color_for(0 if result.chosen.get(m.gpu_class) is m else 3),
            _bar_note(m, result),
        )
        for m in result.measured
    ]
    return svg.bar_chart(bars, title="decode tok/s per GPU at steady state; × the file's own, running")


def _bar_note(m: Measured, result: TuneResult) -> str:
    """A bar's words beside its rate: × as written, its running requests, "chosen"; or its error."""
    if not m.is_ok:
        return f"no rate: {m.error}" if m.error else "no rate"
    r = ratio(m, result.baselines.get(m.gpu_class))
    parts = [
        f"{r:.2f}×" if r is not None else "",
        f"{m.running:.0f} running" if m.running is not None else "",
    ]
    if result.chosen.get(m.gpu_class) is m:
        parts.append("chosen")
    return " · ".join(p for p in parts if p)


def _measured_json(m: Measured, result: TuneResult) -> dict[str, Any]:
    s = m.setting
    return {
        "gpu_class": m.gpu_class.name,
        "candidate": s.name,
        "change": s.change,
        "args": dict(s.args),
        "env_names": sorted(s.env),
        "planned_running": s.running,
        "planned_bound": s.bound,
        "engine_admitted": m.admitted,
        "mean_running": m.running,
        "decode_tps": m.decode_tps,
        "decode_tps_per_gpu": m.decode_tps_per_gpu if m.is_ok else None,
        "completions_per_s": m.completions_per_s,
        "accept_length": m.accept_length,
        "ratio_to_as_written": ratio(m, result.baselines.get(m.gpu_class)),
        "window_s": m.window_s,
        "clients": m.clients,
        "instance": m.instance,
        "at": m.at,
        "chosen": result.chosen.get(m.gpu_class) is m,
        "notes": list(m.notes),
        "error": m.error,
    }


def result_json(result: TuneResult) -> dict[str, Any]:
    finish = {
        name: {"text": f.text(), "seconds": f.seconds, "tokens_per_s": f.tokens_per_s}
        for name, f in (("chosen", result.finish), ("as_written", result.finish_baseline))
        if f is not None
    }
    shape, filler = result.job_shape, result.filler
    return {
        "job": {
            "prompts_counted_with": shape.counted_with,
            "context_tokens": shape.context_tokens,
            "steady_start_filler": None
            if filler is None
            else {
                "unit": filler.unit,
                "unit_tokens": filler.unit_tokens,
                "counted_with": filler.counted_with,
            },
        },
        "classes": {c.name: names for c, names in result.classes.items()},
        "candidates": [_measured_json(m, result) for m in result.measured],
        "chosen": {c.name: m.setting.name for c, m in result.chosen.items()},
        "unmeasured": {c.name: names for c, names in result.unmeasured.items()},
        "rounds": result.rounds,
        "budget_s": result.budget.total_s,
        "used_s": result.budget.used_s,
        "finish": finish,
        "out": str(result.out) if result.out else None,
        "kept": result.kept,
    }


def _print(result: TuneResult, chart_path: Path | None) -> None:
    cli.console.print(result_table(result))
    for cls, names in result.unmeasured.items():
        cli.console.print(f"not measured on {cls.name} (the budget): {', '.join(names)}", highlight=False)
    for name, f in (("chosen", result.finish), ("as written", result.finish_baseline)):
        if f is not None:
            cli.console.print(f"the whole job, {name}: {f.text()}", highlight=False)
    if result.out is not None:
        cli.console.print(f"wrote {result.out} (your fleet file is untouched)", highlight=False, markup=False)
    if chart_path is not None:
        cli.console.print(f"wrote {chart_path}", highlight=False, markup=False)
    if result.kept:
        cli.console.print(f"left running (--keep chosen): {', '.join(result.kept)}", highlight=False)


def _folder(fleet_path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return fleet_path.resolve().parent / ".fleetgen" / "tune" / stamp


@cli.app.command("tune")
def tune_command(
    input_path: Annotated[Path, typer.Argument(help="The job's prompts (as `fleetgen run` reads them).")],
    fleet_path: Path = cli.FLEET_OPTION,
    job_path: Annotated[Path | None, Opt("--job", help="Job file (TOML): the job's sampling.")] = None,
    budget: Annotated[str, Opt("--budget", help="Time the whole tune may take: 20m, 1h, 900s.")] = "20m",
    output_lengths: Annotated[
        str | None,
        Opt(
            "--output-lengths",
            help="Each request writes a length drawn from mean=…,min=…,max=… or an earlier run's folder "
            "(max_tokens + ignore_eos); needed on dummy weights.",
        ),
    ] = None,
    simulate_accept_length: Annotated[
        float | None,
        Opt(
            "--simulate-accept-length",
            min=1.0,
            help="Force this accept length on tune's own speculative servers (dummy weights draft nothing).",
        ),
    ] = None,
    allow_numerics: bool = cli.flag(
        "allow-numerics", "Measure (and choose) settings that change the numbers (bf16 state, FP8 KV)."
    ),
    window: Annotated[float, Opt("--window", min=5.0, help="Seconds measured per candidate.")] = 60.0,
    warmup: Annotated[
        float, Opt("--warmup", min=0.0, help="At most this long (s) for a candidate's batch to fill.")
    ] = 300.0,
    steady_start: bool = cli.flag(
        "steady-start",
        "With --output-lengths: the first batch starts as requests already under way (the job's steady mix "
        "of contexts); --no-steady-start starts it empty (every request at its start: a rate above the "
        "steady one).",
        default=True,
    ),
    out: Annotated[
        Path | None, Opt("--out", help="The tuned fleet file (default: <fleet>.tuned.toml beside it).")
    ] = None,
    narrow: Annotated[
        int, Opt("--narrow", min=0, help="Rounds per GPU class narrowing in on the best's running requests.")
    ] = 2,
    only: Annotated[
        str | None,
        Opt(
            "--only",
            help="Measure only the candidates named (comma-separated names or shell patterns from "
            "`plan --job`, e.g. 'no-radix-*-mf9*,*-mtp'); the fleet file's own is always measured.",
        ),
    ] = None,
    keep: Annotated[str, Opt("--keep", help="chosen: bring the tuned fleet up at the end; none.")] = "none",
    as_json: bool = cli.flag("json", "Print JSON instead of the table."),
) -> None:
    """Measure the job's candidate settings on the fleet's GPUs; write the winners as a new fleet file."""
    if keep not in ("chosen", "none"):
        raise typer.BadParameter("--keep is chosen or none")

    async def go(loaded: Fleet) -> TuneResult:
        job_file = load_job(job_path) if job_path else JobFile()
        load = Load(
            input_path,
            job_file,
            output_lengths_of(output_lengths) if output_lengths else None,
            window,
            warmup,
            simulate_accept_length,
            steady_start,
        )
        target = out or loaded.path.with_name(loaded.path.stem + ".tuned.toml")
        opts = TuneOptions(
            load,
            parse_budget(budget),
            target,
            _folder(loaded.path),
            allow_numerics=allow_numerics,
            keep_chosen=keep == "chosen",
            narrowing_rounds=narrow,
            only=tuple(p.strip() for p in (only or "").split(",") if p.strip()),
        )
        return await tune(loaded, opts, _say)

    result = cli.execute_on(fleet_path, go)
    chart_path = None
    if result.out is not None:
        chart_path = result.out.with_suffix(".svg")
        chart_path.write_text(chart(result), encoding="utf-8")
    if as_json:
        cli.print_json(result_json(result))
    else:
        _print(result, chart_path)
    if not result.chosen:
        cli.render_error(ConfigError("no candidate was measured", fix="see each candidate's error above"))
        raise typer.Exit(1)


def _say(line: str) -> None:
    cli.err_console.print(f"[dim]tune:[/] {escape(line)}", highlight=False)
