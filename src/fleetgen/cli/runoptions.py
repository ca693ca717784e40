"""`fleetgen run`'s command line as one value: `RunOptions` (and `JobFlags`, the flags over the job file),
built once by `cli.run.run_command` from its typer parameters and run by `cli.run.run_job`; the refusals no
run can honour, before anything is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleetgen.cli.app import check_out_dir
from fleetgen.errors import ConfigError
from fleetgen.generate.work import RunMode


@dataclasses.dataclass(frozen=True)
class JobFlags:
    """The flags over the job file's fields (None: not given). Each is checked by the field's own rule
    (`JobFile.overridden`), not by a second copy of it here."""

    concurrency: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    samples: int | None = None
    thinking: bool | None = None
    max_retries: int | None = None


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """`fleetgen run`'s command line as one value: the input and the job's folder, its servers (a fleet file
    or `--endpoint` URLs, `cli.servers.read_servers`), the job file and the flags over it, the pass, the
    waits, and how progress is shown. `run_command` builds it from its typer parameters; `run_job` runs it."""

    input_path: Path
    out: Path
    fleet_path: Path | None = None
    endpoints: tuple[str, ...] = ()
    job_path: Path | None = None
    flags: JobFlags = JobFlags()
    retry_errors: bool = False
    redo_truncated: bool = False
    force_params: bool = False
    add_input: bool = False
    restart_dead: bool = False
    dead_timeout_s: float | None = None  # None: the servers' own (`Servers.dead_timeout_s`)
    wait_ready_s: float | None = None  # None: the fleet's engine.ready_timeout_s; 0 with --endpoint
    hung_after_s: float = 120.0
    split: str | None = None
    live: bool = True  # the live view on a terminal; else (or off one) plain lines every `log_every_s`
    log_every_s: float = 30.0

    @property
    def mode(self) -> RunMode:
        return "retry_errors" if self.retry_errors else "redo_truncated" if self.redo_truncated else "normal"

    def refuse_conflicts(self) -> None:
        """The combinations no run can honour, refused before anything is read or asked."""
        check_out_dir(self.out, "-o")
        if self.retry_errors and self.redo_truncated:
            raise ConfigError(
                "--retry-errors and --redo-truncated are separate passes", fix="run one, then the other"
            )
        if self.redo_truncated and self.flags.max_tokens is None:
            raise ConfigError("--redo-truncated needs a new --max-tokens", fix="add --max-tokens N (larger)")
        if self.restart_dead and self.endpoints:
            raise ConfigError(
                "--restart-dead needs the fleet file, not --endpoint URLs",
                fix="drop --endpoint and pass -f fleet.toml: fleetgen restarts what it deployed",
            )
