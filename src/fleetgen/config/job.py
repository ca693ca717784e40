"""The job file: sampling and dispatch settings for `fleetgen run` (flags override it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from fleetgen.config.common import Strict, load_toml


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

    def overridden(self, **flags: Any) -> JobFile:
        """This job with the command line's flags over it (a flag not given is None: it changes nothing)."""
        return self.model_copy(update={key: value for key, value in flags.items() if value is not None})


def load_job(path: Path) -> JobFile:
    """Read and validate a job file; errors name the file, line and field."""
    return load_toml(path, JobFile, "job file")
