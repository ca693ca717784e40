"""`[engine]`: what to run on every instance, and the engine kinds a fleet file may name."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from fleetgen.config.common import Strict

ArgValue = str | int | float | bool
LOOPBACK = "127.0.0.1"


# The engine kinds a fleet file may name. `fleetgen.engines` registers each of its engines here when it is
# imported (the package's `__init__` imports it first): config sits left of engines and cannot ask it.
ENGINE_KINDS: list[str] = []


def register_engine_kind(name: str) -> None:
    """Let fleet files name engine `name` (called by the engine registry, `fleetgen.engines`)."""
    if name not in ENGINE_KINDS:
        ENGINE_KINDS.append(name)


EngineArgs = dict[str, ArgValue | list[ArgValue]]


def check_arg_names(args: dict[str, Any], where: str) -> dict[str, Any]:
    """Flag names as fleet files write them (no dashes), none of those fleetgen sets per instance."""
    for key in args:
        if key.startswith("-"):
            raise ValueError(f"write flag names without dashes: {key.lstrip('-')!r}, not {key!r}")
        if key in {"host", "port", "api-key"}:
            raise ValueError(f"'{key}' is set by fleetgen per instance; remove it from {where}")
    return args


class EngineConfig(Strict):
    """`[engine]`: what to run on every instance."""

    kind: str
    version: str | None = None
    python: str = "python3"
    model: str
    model_config_dir: str | None = Field(default=None, alias="model_config")
    served_model_name: str | None = None
    launcher: tuple[str, ...] | None = None  # None: the engine's own (`engines.launcher_of`)
    args: EngineArgs = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    base_port: Annotated[int, Field(ge=1024, le=65000)] = 30000
    bind: str = LOOPBACK
    api_key_env: str | None = None
    ready_timeout_s: Annotated[float, Field(gt=0)] = 1800.0

    model_config = ConfigDict(populate_by_name=True)  # merged with Strict's (frozen, extra="forbid")

    @field_validator("kind")
    @classmethod
    def _known_engine(cls, kind: str) -> str:
        if kind not in ENGINE_KINDS:
            known = ", ".join(repr(k) for k in ENGINE_KINDS) or "none (fleetgen.engines was not imported)"
            raise ValueError(f"unknown engine {kind!r}; known engines: {known}")
        return kind

    @field_validator("args")
    @classmethod
    def _no_managed_flags(cls, args: dict[str, Any]) -> dict[str, Any]:
        return check_arg_names(args, "engine.args")

    @model_validator(mode="after")
    def _public_bind_needs_key(self) -> EngineConfig:
        if self.is_public and not self.api_key_env:
            raise ValueError(
                f"bind = {self.bind!r} exposes the servers beyond this host; set engine.api_key_env to the "
                "name of an environment variable holding an API key, or keep bind = '127.0.0.1' (SSH tunnels)"
            )
        return self

    @property
    def is_public(self) -> bool:
        return self.bind != LOOPBACK
