"""The job file: sampling and dispatch settings for `fleetgen run` (flags override it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from fleetgen.config.common import Strict, load_toml
from fleetgen.errors import ConfigError


class JobFile(Strict):
    """A job file: sampling and dispatch settings for `fleetgen run` (flags override it)."""

    id_field: str = "id"
    prompt_field: str = "prompt"
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] = 4096
    temperature: Annotated[float, Field(ge=0)] = 0.6
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    top_k: int | None = None
    seed: int | None = None
    samples: Annotated[int, Field(ge=1)] = 1
    thinking: bool = True
    system_prompt: str | None = None
    concurrency: Annotated[int, Field(ge=1)] | None = None
    max_retries: Annotated[int, Field(ge=0)] = 5
    request_timeout_s: Annotated[float, Field(gt=0)] = 3600.0
    max_consecutive_failures: Annotated[int, Field(ge=1)] = 50
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # The trainer's sequence length (SpecForge's `max_length`): `plan --job` and `run` warn when max_tokens
    # plus the longest prompt exceeds it; the training exports count (and cut or drop) rows past it.
    max_length: Annotated[int, Field(ge=1)] | None = None
    # A local copy of the model folder the servers load (its tokenizer files): the chat template a run
    # records for the token export. A fleet's model folder is read from its first host without it.
    model_dir: str | None = None

    def overridden(self, **flags: Any) -> JobFile:
        """This job with the command line's flags over it (a flag not given is None: it changes nothing).

        Each flag is checked by the rule that checks the file's field (the same model, validated again): a
        value the file would refuse is refused here, naming the flag (`--top-p 5`), before any server is
        asked. `model_copy(update=…)` would skip that check and send the value to every server."""
        given = {field: value for field, value in flags.items() if value is not None}
        try:
            return type(self).model_validate({**self.model_dump(exclude_unset=True), **given})
        except ValidationError as exc:
            raise _flag_error(exc, given) from exc


def flag_of(field: str) -> str:
    """The command-line flag that overrides a job file's field: `top_p` → `--top-p`."""
    return "--" + field.replace("_", "-")


def _flag_error(exc: ValidationError, given: dict[str, Any]) -> ConfigError:
    """The refused flags, each with its value and the file's rule in pydantic's words."""
    lines, flags = [], []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        name = flag_of(field) if field in given else field  # only a flag can be wrong: the file was checked
        flags.append(name)
        lines.append(f"{name} {given.get(field)!r}: {err['msg'].removeprefix('Value error, ')}")
    return ConfigError(
        "; ".join(lines),
        fix=f"give {', '.join(dict.fromkeys(flags))} a value the job file's field accepts (the lines say "
        "which), or leave the flag out to keep the job file's",
    )


def load_job(path: Path) -> JobFile:
    """Read and validate a job file; errors name the file, line and field."""
    return load_toml(path, JobFile, "job file")
