"""One instance's plan: size it with its engine's arithmetic, check its flags, build its argv and env.

Engines plug in through `fleetgen.plan.planners` (name → `Planner`, looked up once by the caller and passed
in); nothing here branches on an engine's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fleetgen.config import EngineConfig, Instance
from fleetgen.engines import RuleSet, get_engine, launcher_of, select_rule_set
from fleetgen.plan.types import GIB, Ask, HostFacts, Issue, Planner, Sizing

# The 0600 config file a public bind's key reaches an engine through when it reads no key env var (SGLang's
# `--config`). Relative: `up` starts every engine in its own instance folder, where it pushes this file, so
# the argv `plan` shows is the argv `up` launches, whatever the host's workdir expands to.
API_KEY_CONFIG = "api_key.yaml"


def size(planner: Planner, ask: Ask) -> Sizing:
    """Size one instance with its engine's rules (`--quantization fp8` of 16-bit weights: one byte each)."""
    if can_quantize_fp8(ask) and ask.args.get("quantization") == "fp8":
        shape = ask.shape
        fp8 = replace(
            shape, weight_bytes=shape.weight_bytes // 2, mtp_weight_bytes=shape.mtp_weight_bytes // 2
        )
        ask = replace(ask, shape=fp8)
    return _weights_first(planner.size(ask), ask)


def can_quantize_fp8(ask: Ask) -> bool:
    """Online FP8 quantisation (`--quantization fp8` in every engine) halves 16-bit weights that are not
    quantised already."""
    return ask.shape.dtype_bytes == 2 and not ask.shape.is_quantized


# What an engine's arithmetic reports when the weights leave nothing: the consequences (a negative Mamba pool,
# no KV pool), not the cause. `_weights_first` names the cause instead.
CONSEQUENCES = frozenset({"mamba-pool", "weights", "kv-cache"})
WEIGHTS_FIX = "more GPUs per instance (tp) or smaller weights (FP8 quantisation, a quantised checkpoint)"


def _weights_first(sized: Sizing, ask: Ask) -> Sizing:
    """Weights that alone fill the GPU (or the engine's static budget): that is the error, named with both
    numbers, and nothing is left for the pools (zero, never the negative numbers the arithmetic reaches)."""
    m = sized.memory
    if m.weights_bytes < min(ask.total_bytes, m.budget_bytes):
        return sized
    weights = f"the weights alone need {m.weights_bytes / GIB:.1f} GiB per GPU (tp = {ask.tp})"
    if m.weights_bytes >= ask.total_bytes:
        text = f"{weights}; the GPU has {ask.total_bytes / GIB:.1f} GiB"
    else:
        text = (
            f"{weights}; the engine's static budget is {m.budget_bytes / GIB:.1f} GiB "
            f"({m.extras.budget_setting()}): nothing is left for the KV cache"
        )
    issue = Issue("weights-exceed-gpu", text, WEIGHTS_FIX)
    others = tuple(e for e in sized.errors if e.rule not in CONSEQUENCES)
    return replace(sized, memory=m.without_pools(), errors=(issue, *others))


@dataclass(frozen=True)
class Launch:
    """What one instance runs, and what decided it: the engine version and the rule set read for it."""

    argv: tuple[str, ...]  # python, launcher, the engine's arguments
    env: Mapping[str, str]
    rules: RuleSet
    version: str | None  # the host's engine version, else engine.version; None: unknown (newest rules)
    rule_warning: str | None = None

    @property
    def python(self) -> str:
        return self.argv[0]


def decide_launch(cfg: EngineConfig, inst: Instance, facts: HostFacts, version: str | None = None) -> Launch:
    """THE place an instance's argv and env are decided: `plan` shows them and `up` launches them.

    From the fleet file's engine section, the instance, and the engine version the host runs (`facts`, as
    measured), else `version`, else `engine.version`. The model shape and GPU facts size the plan but
    change no flag: fleetgen launches what the user wrote (a plan's fixes are suggestions).
    """
    engine = get_engine(cfg.kind)
    chosen = facts.engine_version or version or cfg.version
    rules, warning = select_rule_set(engine.rule_sets, chosen)
    args = engine.build_argv(cfg, inst, rules)
    if cfg.is_public and cfg.api_key_env and not engine.api_key_env_var and engine.api_key_config_flag:
        args = [*args, engine.api_key_config_flag, API_KEY_CONFIG]
    argv = (cfg.python, *launcher_of(cfg), *args)
    return Launch(argv, engine.build_env(cfg, inst), rules, chosen, warning)
