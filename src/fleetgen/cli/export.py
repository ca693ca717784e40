"""`fleetgen export`: a job's results as a file for a trainer or a reader (`generate.export`), with its
sidecar (`FILE.meta.json`)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Annotated

import typer

import fleetgen.cli.app as cli
from fleetgen.errors import FleetgenError
from fleetgen.generate.export import FORMATS, export
from fleetgen.generate.export_meta import sidecar_path
from fleetgen.generate.export_tally import ExportSummary

Opt = typer.Option


@cli.app.command("export")
def export_command(
    out_dir: cli.JobFolder,
    fmt: Annotated[str, Opt("--format", help=f"One of: {', '.join(FORMATS)}.")] = "jsonl",
    to: Annotated[Path | None, Opt("--to", help="Output file (default: OUT_DIR/export.FORMAT.EXT).")] = None,
    filters: Annotated[
        list[str] | None,
        Opt(
            "--filter",
            help="clean | FLAG | no-FLAG (repeatable); truncated, empty, leaked_think, repetitive.",
        ),
    ] = None,
    inline_think: bool = cli.flag("inline-think", "Reasoning inline as <think>…</think>."),
    max_length: Annotated[
        int | None,
        Opt(
            "--max-length",
            min=1,
            help="The trainer's max_length (sharegpt, specforge-tokens; default: the job file's): rows "
            "longer are counted, and cut there or dropped (--over-length).",
        ),
    ] = None,
    over_length: Annotated[
        str, Opt("--over-length", help="Past --max-length: cut (where the trainer cuts) or drop.")
    ] = "cut",
    model_dir: Annotated[
        Path | None,
        Opt(
            "--model-dir",
            help="The model folder (chat template, tokenizer.json) for tokens (default: the one the run "
            "recorded, OUT_DIR/model).",
        ),
    ] = None,
    json_out: bool = cli.flag("json", "Print the summary as JSON."),
) -> None:
    """Export results (streamed): parquet, jsonl, SpecForge sharegpt or pre-tokenized rows, or OpenAI batch
    output; a sidecar FILE.meta.json says what the rows are."""
    ext = "parquet" if fmt == "parquet" else "jsonl"
    target = to or out_dir / f"export.{fmt}.{ext}"

    async def go() -> ExportSummary:
        cli.check_out_dir(out_dir, "OUT_DIR")
        return await asyncio.to_thread(
            functools.partial(
                export,
                max_length=max_length,
                over_length=over_length,
                model_dir=model_dir,
            ),
            out_dir,
            fmt,
            target,
            filters or [],
            inline_think,
        )

    summary = cli.execute(go())
    if json_out:
        cli.print_json(summary)
    else:
        cli.console.print(
            f"wrote {summary.rows} rows to {summary.path} ({summary.format}); what they are: "
            f"{sidecar_path(Path(summary.path))}",
            markup=False,
        )
        for note in summary.notes:
            cli.console.print(f"  {note}", highlight=False, markup=False)
        for why, num in summary.dropped.items():
            cli.console.print(f"  dropped {num}: {why}", highlight=False, markup=False)
    if summary.rows == 0:  # an empty training file is nothing useful (SpecForge's validator refuses it)
        cli.render_error(FleetgenError("no row was written (see the reasons above)"))
        raise typer.Exit(1)
