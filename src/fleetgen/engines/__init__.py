"""The engine registry: every engine fleetgen knows, by name (`get_engine("sglang")`).

An engine is one module (`sglang.py`, `vllm.py`) subclassing `fleetgen.engines.base.Engine`, plus its line
in `ENGINES` below; its plan arithmetic registers in `fleetgen.plan.planners`. Callers never branch on an
engine's name: they ask the registry and the engine. The fleet file's `engine.kind` is checked against the
names registered here (`config.register_engine_kind`: config sits left of engines and cannot import it).
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetgen.config import EngineConfig, register_engine_kind
from fleetgen.engines.base import Engine, ParserVerdict, format_args
from fleetgen.engines.rules import RuleSet, Translation, select_rule_set, translate_args
from fleetgen.engines.sglang import SGLangEngine
from fleetgen.engines.vllm import VLLMEngine
from fleetgen.errors import ConfigError

# The first one is the default where nothing tells the engine apart (a server that exports no metrics).
ENGINES: dict[str, Engine] = {e.name: e for e in (SGLangEngine(), VLLMEngine())}
for _name in ENGINES:
    register_engine_kind(_name)


def get_engine(kind: str) -> Engine:
    """The registered engine called `kind`."""
    try:
        return ENGINES[kind]
    except KeyError:
        raise ConfigError(
            f"unknown engine {kind!r}", fix=f"engine.kind is one of: {', '.join(ENGINES)}"
        ) from None


def launcher_of(cfg: EngineConfig) -> tuple[str, ...]:
    """What runs the engine after python: `engine.launcher`, else the engine's (`-m sglang.launch_server`)."""
    return cfg.launcher if cfg.launcher is not None else get_engine(cfg.kind).default_launcher


def engine_of_metrics(samples: Mapping[str, float]) -> Engine:
    """The registered engine whose metric prefix (`sglang:`, `vllm:`) scraped names carry; else the first."""
    first = next(iter(ENGINES.values()))
    return next((e for e in ENGINES.values() if any(n.startswith(f"{e.name}:") for n in samples)), first)


def metric_names_read() -> frozenset[str]:
    """Every sample name fleetgen reads of any registered engine (`MetricNames.read`): what `/metrics` is
    parsed for, whichever engine serves it."""
    return frozenset(name for engine in ENGINES.values() for name in engine.metrics.read)


__all__ = [
    "ENGINES",
    "Engine",
    "ParserVerdict",
    "RuleSet",
    "Translation",
    "engine_of_metrics",
    "format_args",
    "get_engine",
    "launcher_of",
    "metric_names_read",
    "select_rule_set",
    "translate_args",
]
