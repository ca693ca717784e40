"""`fleetgen run`'s command line read into one value (`RunOptions`) and run by `run_job`: every option of
the typer command lands in its field, the refusals come before anything is read, and the value runs a real
job on a stand-in server (tests/fixtures/standin.py says why a stand-in).

Filed under `cli/run.py`, with `cli/runoptions.py` (the value)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import fleetgen.cli.run as run_cli
from fleetgen.cli import register
from fleetgen.cli.app import app
from fleetgen.cli.run import run_job
from fleetgen.cli.runoptions import JobFlags, RunOptions
from fleetgen.errors import ConfigError, FleetgenError
from tests.fixtures.jobs import write_jsonl
from tests.fixtures.standin import StandIn, serve

register([])

# each option of `fleetgen run` given a value other than its default, and the field it must land in
GIVEN: list[tuple[list[str], str, Any]] = [
    (["-f", "fleet-b.toml"], "fleet_path", Path("fleet-b.toml")),
    (["-e", "http://h:1", "-e", "http://h:2"], "endpoints", ("http://h:1", "http://h:2")),
    (["--job", "job.toml"], "job_path", Path("job.toml")),
    (["--concurrency", "7"], "flags.concurrency", 7),
    (["--max-tokens", "99"], "flags.max_tokens", 99),
    (["--temperature", "0.3"], "flags.temperature", 0.3),
    (["--top-p", "0.9"], "flags.top_p", 0.9),
    (["--top-k", "5"], "flags.top_k", 5),
    (["--seed", "11"], "flags.seed", 11),
    (["--samples", "3"], "flags.samples", 3),
    (["--no-thinking"], "flags.thinking", False),
    (["--max-retries", "2"], "flags.max_retries", 2),
    (["--retry-errors"], "retry_errors", True),
    (["--redo-truncated"], "redo_truncated", True),
    (["--force-params"], "force_params", True),
    (["--add-input"], "add_input", True),
    (["--restart-dead"], "restart_dead", True),
    (["--dead-timeout", "12"], "dead_timeout_s", 12.0),
    (["--wait-ready", "13"], "wait_ready_s", 13.0),
    (["--hung-after", "14"], "hung_after_s", 14.0),
    (["--split", "test"], "split", "test"),
    (["--no-live"], "live", False),
    (["--log-every", "5"], "log_every_s", 5.0),
]


def _field(options: RunOptions, dotted: str) -> Any:
    value: Any = options
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _read(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> RunOptions:
    """The `RunOptions` the command builds from `argv` (its run stopped right there)."""
    seen: list[RunOptions] = []

    async def capture(options: RunOptions) -> Any:
        seen.append(options)
        raise FleetgenError("captured")

    monkeypatch.setattr(run_cli, "run_job", capture)
    result = CliRunner().invoke(app, ["run", "in.jsonl", "-o", "out", *argv])
    assert seen, result.output
    return seen[0]


@pytest.mark.parametrize(("argv", "field", "value"), GIVEN, ids=[g[1] for g in GIVEN])
def test_every_option_of_run_lands_in_its_field_of_the_one_value(
    argv: list[str], field: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = _read([], monkeypatch)
    assert (default.input_path, default.out) == (Path("in.jsonl"), Path("out"))
    got = _read(argv, monkeypatch)
    assert _field(got, field) == value != _field(default, field)
    # nothing else moved
    changed = {
        f.name for f in dataclasses.fields(RunOptions) if getattr(got, f.name) != getattr(default, f.name)
    }
    assert changed == {field.split(".")[0]}


def test_the_options_of_run_are_all_covered() -> None:
    """A new option of `run` needs its line in GIVEN (and its field in `RunOptions`)."""
    flag_fields = {f.name for f in dataclasses.fields(JobFlags)}
    fields = {f.name for f in dataclasses.fields(RunOptions)} - {"input_path", "out", "flags"}
    assert {g[1] for g in GIVEN} == fields | {f"flags.{name}" for name in flag_fields}


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"retry_errors": True, "redo_truncated": True}, "separate passes"),
        ({"redo_truncated": True}, "--redo-truncated needs a new --max-tokens"),
        ({"restart_dead": True, "endpoints": ("http://127.0.0.1:9",)}, "--restart-dead needs the fleet"),
    ],
)
async def test_conflicting_options_are_refused_before_anything_is_read(
    tmp_path: Path, options: dict[str, Any], said: str
) -> None:
    absent = tmp_path / "no-such-input.jsonl"  # never opened: the refusal comes first
    with pytest.raises(ConfigError) as err:
        await run_job(RunOptions(absent, tmp_path / "out", **options))
    assert said in err.value.message and err.value.fix


async def test_the_value_runs_a_job_with_its_flags_over_the_job_file(tmp_path: Path) -> None:
    records = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"p{i}"} for i in range(5)])
    (tmp_path / "job.toml").write_text("max_tokens = 32\nsamples = 1\n")
    async with serve(StandIn()) as server:
        options = RunOptions(
            records,
            tmp_path / "out",
            endpoints=(server.url,),
            job_path=tmp_path / "job.toml",
            flags=JobFlags(samples=2, max_tokens=40),
            live=False,
        )
        summary, _ = await run_job(options)
    assert summary.status == "complete" and summary.results == 10  # 5 records × the flag's 2 samples
    assert {body["max_tokens"] for body in server.bodies} == {40}  # the flag over the file's 32
