"""Engines by name: `get_engine("sglang")`, `get_engine("vllm")`.

Each engine module implements the `Engine` protocol (`fleetgen.engines.base`); callers never branch on the
engine's name, they ask the registry.
"""

from __future__ import annotations

from fleetgen.engines.base import (
    Engine,
    FatalSignature,
    FlagRename,
    MetricNames,
    ParserVerdict,
    RuleSet,
    Translation,
    format_args,
    parse_version,
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


def full_command(engine: Engine, python: str, launcher: tuple[str, ...], args: list[str]) -> list[str]:
    """The whole command line: the host's python, the launcher (`-m sglang.launch_server`), the arguments."""
    return [python, *launcher, *args]


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
    "full_command",
    "get_engine",
    "parse_version",
    "select_rule_set",
    "translate_args",
]
