"""Flags as strict as the file (issue 21 §5): every command-line flag that overrides a job file's field is
checked by that field's own rule. `fleetgen run --top-p 5` once reached the servers (`model_copy(update=…)`
skips validation) and the job stopped only after repeated rejections."""

from __future__ import annotations

import math
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetgen.cli import register
from fleetgen.cli.app import app
from fleetgen.config import JobFile, load_job
from fleetgen.config.job import flag_of
from fleetgen.errors import ConfigError

register([])  # every topic module
ROOT: Any = typer.main.get_command(app)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # what a TOML integer can hold


def overriding_flags(command: Any) -> dict[str, type]:
    """The command's options named for a job file's field (`--top-p` for `top_p`): field → the flag's type."""
    found: dict[str, type] = {}
    for param in command.params:
        for opt in getattr(param, "opts", []):
            field = opt.removeprefix("--").replace("-", "_")
            if opt.startswith("--") and field in JobFile.model_fields:
                found[field] = param.type_descriptor.annotation
    return found


RUN_FLAGS = overriding_flags(ROOT.commands["run"])


def values_for(kind: type) -> st.SearchStrategy[Any]:
    """Every value the flag's own type parses: the rule of the field, not typer's, must do the refusing."""
    kinds: dict[type, st.SearchStrategy[Any]] = {
        bool: st.booleans(),
        int: INT64,
        float: st.floats(allow_nan=True, allow_infinity=True),
    }
    return kinds[kind]


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)  # int; float as TOML writes it too: 0.5, 1e+16, inf, -inf, nan


def file_verdict(field: str, value: Any) -> JobFile | ConfigError:
    """What a job file holding `field = value` reads as: the rule a flag must follow."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.toml"
        path.write_text(f"{field} = {toml_literal(value)}\n", encoding="utf-8")
        try:
            return load_job(path)
        except ConfigError as exc:
            return exc


def test_the_overriding_flags_of_run_are_found_and_bench_job_overrides_thinking() -> None:
    """The property below is over every flag found here: the search must find the ones we know of."""
    known = {"concurrency", "max_tokens", "temperature", "top_p", "top_k", "seed", "samples", "thinking"}
    assert known | {"max_retries"} == set(RUN_FLAGS)
    # bench's --concurrency is its sweep's levels, not the job's; --thinking and --model go over `--job`
    assert set(overriding_flags(ROOT.commands["bench"])) == {"thinking", "model", "concurrency"}


@st.composite
def flag_and_value(draw: st.DrawFn) -> tuple[str, Any]:
    field = draw(st.sampled_from(sorted(RUN_FLAGS)))
    return field, draw(values_for(RUN_FLAGS[field]))


@settings(max_examples=300, deadline=None)
@given(flag_and_value(), st.sampled_from([None, "top_p = 0.5\nsamples = 3\n"]))
def test_a_flag_refuses_what_the_file_refuses_and_accepts_what_it_accepts(
    flag_value: tuple[str, Any], base_text: str | None
) -> None:
    field, value = flag_value
    by_file = file_verdict(field, value)
    with tempfile.TemporaryDirectory() as tmp:
        base = JobFile()
        if base_text is not None:
            (Path(tmp) / "base.toml").write_text(base_text, encoding="utf-8")
            base = load_job(Path(tmp) / "base.toml")
        try:
            by_flag: JobFile | ConfigError = base.overridden(**{field: value})
        except ConfigError as exc:
            by_flag = exc
    if isinstance(by_file, ConfigError):
        assert isinstance(by_flag, ConfigError), (field, value, by_flag)
        assert by_flag.message.startswith(f"{flag_of(field)} "), by_flag.message
        assert flag_of(field) in by_flag.fix and by_flag.exit_code == 2
        return
    assert isinstance(by_flag, JobFile), (field, value, by_flag.message)
    got, want = getattr(by_flag, field), getattr(by_file, field)
    assert got == want or (math.isnan(got) and math.isnan(want))
    assert by_flag.model_dump(exclude={field}) == base.model_dump(exclude={field})  # the rest is the file's


def refused_value(field: str, kind: type) -> str | None:
    """A value of the flag's type the file's field refuses, or None where the field takes all of them."""
    probes: dict[type, list[float]] = {int: [0, -1], float: [5.0, -1.0], bool: []}  # `--top-p 5`: as found
    bad = [v for v in probes[kind] if isinstance(file_verdict(field, v), ConfigError)]
    return str(bad[0]) if bad else None


REFUSABLE = {flag_of(f): v for f, o in RUN_FLAGS.items() if (v := refused_value(f, o)) is not None}


def test_every_constrained_flag_has_a_refused_value_to_try() -> None:
    assert set(REFUSABLE) == {
        f"--{n}" for n in ["concurrency", "max-tokens", "temperature", "top-p", "samples", "max-retries"]
    }


@pytest.mark.parametrize(("flag", "value"), sorted(REFUSABLE.items()))
def test_run_refuses_the_flag_before_contacting_any_server(tmp_path: Path, flag: str, value: str) -> None:
    """A listening socket stands for the server: a run that got as far as the servers would connect to it."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n', encoding="utf-8")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        argv = ["run", str(prompts), "-o", str(tmp_path / "out"), "-e", url, "--no-live", flag, value]
        result = CliRunner().invoke(app, argv)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"error: {flag} {value}" in text and "fix:" in text
    assert not (tmp_path / "out").exists()
