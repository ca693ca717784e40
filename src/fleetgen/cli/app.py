"""The typer app and the one place errors become exit codes.

Command modules (`fleetgen.cli.<topic>`) register on `app` and call `execute(coro)`: `asyncio.run` once per
command, the error tree rendered once, here. Only the CLI prints or exits.

`read_fleet` is the command's one read of its fleet file (a `Fleet`, passed down to deploy/fleet/generate,
which never read it again), remembering the API key for the redactor; `execute_on` runs the command's work
on it inside `execute` ("fleet file or URLs" for `run`, `bench` and `dashboard` is `cli.servers`). Also
here: the one table builder and `--json` printer (`table`, `print_json`), the options several commands share
(the fleet file's, `--endpoint`, the job folder), and `on_stop` / `until_stopped` for Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic_core
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.errors import ConfigError, FleetgenError
from fleetgen.redact import redacting, remember

app = typer.Typer(
    name="fleetgen",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Plan, deploy and verify SGLang/vLLM servers over SSH, then generate training data exactly once."""
    # A callback keeps `fleetgen` a command group even when only one topic module is imported (see
    # cli/__init__.py): typer would otherwise collapse a one-command app into that command.
    # Every command prints through these: each secret fleetgen read (the API key) is redacted from every
    # line it prints, whatever the line came from (a host's log, an error, a table).
    sys.stdout = redacting(sys.stdout)
    sys.stderr = redacting(sys.stderr)


UNCUT_WIDTH = 100_000  # off a terminal: wider than any line fleetgen prints


def _console(*, stderr: bool) -> Console:
    """Rich on a terminal. Off one (a pipe, a log file, `nohup`) nothing is wrapped or cut, whatever COLUMNS
    says: a path stays one string, a table cell stays whole (`--json` is there for machines)."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=UNCUT_WIDTH, soft_wrap=True)


console = _console(stderr=False)
err_console = _console(stderr=True)
T = TypeVar("T")


def read_fleet(path: Path) -> Fleet:
    """The command's fleet file, read once (a bad one raises ConfigError naming file, line and field); from
    here on, the fleet's API key (when its variable is set) is redacted from everything the command prints
    (a host's log or an error may hold it). Call it inside `execute`, which renders that error."""
    fleet = Fleet.load(path)
    engine = fleet.file.engine
    if engine.is_public and engine.api_key_env:
        remember(os.environ.get(engine.api_key_env, ""))
    return fleet


FLEET_OPTION = typer.Option(Path("fleet.toml"), "--fleet", "-f", help="The fleet file (TOML).")
# `run` and `dashboard`: no fleet file given is fleet.toml unless other servers are (`--endpoint`).
FleetOrNone = Annotated[Path | None, typer.Option("--fleet", "-f", help="Fleet file (`fleetgen up` state).")]

Endpoints = Annotated[
    list[str] | None,
    typer.Option("--endpoint", "-e", help="Server URL http://HOST:PORT instead of -f (repeatable)."),
]
JobFolder = Annotated[Path, typer.Argument(help="The folder given to `fleetgen run -o`.")]


def flag(name: str, help: str, default: bool | None = False, *, short: str = "") -> Any:
    """A boolean option in the one convention of every command: `--NAME` / `--no-NAME`, never a value after
    it; help shows both spellings, not `<bool>`. `default=None`: neither given (the job file decides)."""
    decls = [f"--{name}/--no-{name}", *([short] if short else [])]
    return typer.Option(default, *decls, help=help, metavar="")


def execute(coro: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine; render a FleetgenError (message, context, fix) and exit with its code."""
    try:
        return asyncio.run(coro)
    except FleetgenError as exc:
        render_error(exc)
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:  # a path the user gave (a file where a folder goes, no permission, disk full)
        where = " → ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        what = exc.strerror or type(exc).__name__
        fix = "check the path and its permissions (and free disk space), then run the same command again"
        render_error(FleetgenError(f"{what}: {where}" if where else f"{what}: {exc}", fix=fix))
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print(
            "[yellow]interrupted[/]: nothing half-written; run the same command again to resume"
        )
        raise typer.Exit(130) from None


def execute_on(fleet_path: Path, work: Callable[[Fleet], Awaitable[T]]) -> T:
    """`execute` a command's work on its fleet file, read once inside it (`read_fleet`): a bad file is
    rendered as every error is."""

    async def go() -> T:
        return await work(read_fleet(fleet_path))

    return execute(go())


def render_error(exc: FleetgenError) -> None:
    """Print an error as: what happened (red), its context lines, and the fix."""
    err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
    for key, value in exc.context.items():
        if value not in (None, ""):
            text = str(value)
            if "\n" in text:
                err_console.print(f"  [dim]{escape(key)}:[/]", highlight=False)
                err_console.print(
                    "\n".join("    " + line for line in text.splitlines()), highlight=False, markup=False
                )
            else:
                err_console.print(f"  [dim]{escape(key)}:[/] {escape(text)}", highlight=False)
    if exc.fix:
        err_console.print(f"  [bold green]fix:[/] {escape(exc.fix)}", highlight=False)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def on_stop(handler: Callable[[], object]) -> Iterator[None]:
    """Inside the block, Ctrl-C and SIGTERM call `handler` (they do not interrupt the event loop)."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def until_stopped(work: Awaitable[None]) -> None:
    """Run a watch, a follow or a server until Ctrl-C (or SIGTERM): that is how they end, so it is no error
    (exit 0). Cancelling the work closes what it holds: SSH channels (which stops a remote `tail -F`), the
    dashboard's listener."""
    stop = asyncio.Event()
    task, stopper = asyncio.ensure_future(work), asyncio.create_task(stop.wait())
    with on_stop(stop.set):
        try:
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, stopper):
                pending.cancel()
            await asyncio.gather(task, stopper, return_exceptions=True)
    if task in done:
        task.result()  # the work ended by itself: its error (if any) is the command's


def table(columns: str, *, numbers: bool = False, no_wrap: bool = False, **options: Any) -> Table:
    """A rich table of `columns` separated by "|"; with `numbers`, every column after the first is
    right-aligned."""
    grid = Table(**options)
    for index, name in enumerate(columns.split("|")):
        grid.add_column(name, justify="right" if numbers and index else "left", no_wrap=no_wrap)
    return grid


def print_json(value: object, indent: int | None = 2) -> None:
    """`--json`: a value (dataclasses, paths and enums included) as JSON on stdout."""
    print(pydantic_core.to_json(value, indent=indent).decode(), flush=True)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def exit_with(code: int) -> None:
    sys.stdout.flush()
    raise typer.Exit(code)


def check_out_dir(out: Path, flag: str) -> None:
    """The output is a folder (the store, its lock, exports): a file there is refused before anything runs."""
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"{flag} {out} is a file: the output of a job is a folder (results.sqlite and its lock)",
            fix=f"give {flag} a folder: a new path, or the folder of an earlier run to resume it",
            context={"path": str(out)},
        )
