"""Engines by name: `get_engine("sglang")`, `get_engine("vllm")`.

Each engine module implements the `Engine` protocol (`fleetgen.engines.base`); callers never branch on the
engine's name, they ask the registry.
"""

from __future__ import annotations

from fleetgen.config import EngineSpec
from fleetgen.engines.base import (
    Engine,
    FatalSignature,
    FlagRename,
    MetricNames,
    ParserVerdict,
    RuleSet,
    Translation,
    format_args,
    select_rule_set,
    translate_args,
)
from fleetgen.engines.sglang import SGLangEngine
from fleetgen.engines.vllm import VLLMEngine
from fleetgen.errors import ConfigError

ENGINES: dict[str, Engine] = {"sglang": SGLangEngine(), "vllm": VLLMEngine()}


def get_engine(kind: str) -> Engine:
    """The registered engine called `kind`."""
    try:
        return ENGINES[kind]
    except KeyError:
        raise ConfigError(
            f"unknown engine {kind!r}", fix=f"engine.kind is one of: {', '.join(ENGINES)}"
        ) from None


def launcher_of(spec: EngineSpec) -> tuple[str, ...]:
    """What runs the engine after python: `engine.launcher`, else the engine's (`-m sglang.launch_server`)."""
    return spec.launcher if spec.launcher is not None else get_engine(spec.kind).default_launcher


__all__ = [
    "ENGINES",
    "Engine",
    "FatalSignature",
    "FlagRename",
    "MetricNames",
    "ParserVerdict",
    "RuleSet",
    "Translation",
    "format_args",
    "get_engine",
    "launcher_of",
    "select_rule_set",
    "translate_args",
]
