"""One instance's plan: size it with its engine's arithmetic, check its flags, build its argv and env.

Engines plug in through `SIZERS` (name → function); nothing here branches on the engine's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleetgen.config import EngineSpec, InstanceSpec
from fleetgen.engines import RuleSet, get_engine, launcher_of, select_rule_set, translate_args
from fleetgen.modelcard import ModelShape
from fleetgen.plan.rules import RuleInput, check_sglang_flags
from fleetgen.plan.settings import resolve_settings
from fleetgen.plan.sglang import draft_kv_in_cell, size_sglang
from fleetgen.plan.types import GIB, GpuFacts, HostFacts, Issue, Memory
from fleetgen.plan.vllm import size_vllm

HICACHE_RESERVE_BYTES = 10 * GIB  # SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES
# The 0600 config file a public bind's key reaches an engine through when it reads no key env var (SGLang's
# `--config`). Relative: `up` starts every engine in its own instance folder, where it pushes this file, so
# the argv `plan` shows is the argv `up` launches, whatever the host's workdir expands to.
API_KEY_CONFIG = "api_key.yaml"


@dataclass(frozen=True)
class Sizing:
    """An engine's verdict on one set of flags: numbers, errors, warnings, resolved settings."""

    memory: Memory
    errors: tuple[Issue, ...] = ()
    warnings: tuple[Issue, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class Ask:
    """What to size: the flags (as the user wrote them), env, TP, the GPU and the rule set."""

    args: Mapping[str, Any]
    env: Mapping[str, str]
    tp: int
    free_bytes: int
    total_bytes: int
    rules: RuleSet
    shape: ModelShape


def _size_sglang(ask: Ask) -> Sizing:
    translation = translate_args(ask.args, ask.rules)
    s = resolve_settings(translation.args, ask.env, ask.rules, ask.shape)
    memory, mem_errors = size_sglang(
        ask.shape, s, ask.rules, tp=ask.tp, free_bytes=ask.free_bytes, total_bytes=ask.total_bytes
    )
    flags = check_sglang_flags(RuleInput(ask.args, ask.env, translation, s, ask.rules, ask.shape))
    warnings = list(flags.warnings)
    if memory.headroom_needed_bytes > memory.headroom_bytes:
        warnings.append(_headroom_warning(memory, s.is_spec and not draft_kv_in_cell(s, ask.rules)))
    if 0 < memory.kv_tokens < memory.context_length:
        warnings.append(_context_warning(memory))
    if s.is_hicache:
        memory = replace(
            memory,
            hicache_host_bytes=_hicache_bytes(
                memory, s.hicache_ratio, s.hicache_size_gb, ask.shape.is_hybrid and ask.rules.hicache_hybrid
            ),
        )
    resolved = {
        "mem_fraction_static": memory.mem_fraction_static,
        "mamba_strategy": s.strategy,
        "overlap_schedule": s.is_overlap,
        "speculative_num_draft_tokens": s.draft_tokens,
        "mamba_ratio": s.mamba_ratio,
        "context_length": s.context_length,
        "ssm_dtype": s.ssm_dtype,
    }
    errors = tuple(flags.errors) + (tuple(mem_errors) if not flags.errors else ())
    return Sizing(memory, errors, tuple(warnings), resolved)


def _context_warning(m: Memory) -> Issue:
    return Issue(
        "full-context",
        f"one request of full context ({m.context_length:,} tokens) does not fit: the KV pool holds "
        f"{m.kv_tokens:,} tokens per GPU",
        f"set context-length <= {m.kv_tokens:,} (e.g. 8192) if requests are shorter, or use tp = 2",
    )


def _headroom_warning(m: Memory, with_draft: bool) -> Issue:
    draft = " and the MTP draft (weights + its own KV pool)" if with_draft else ""
    return Issue(
        "headroom",
        f"(1 - mem-fraction-static) leaves {m.headroom_bytes / GIB:.1f} GiB outside the static pools; "
        f"activations, CUDA graphs{draft} are estimated at {m.headroom_needed_bytes / GIB:.1f} GiB "
        "(SGLang's own reserve formula): a CUDA OOM at graph capture is likely",
        "lower mem-fraction-static (or leave it out for SGLang's default) or cuda-graph-max-bs",
    )


def _hicache_bytes(m: Memory, ratio: float, size_gb: int, is_hybrid: bool) -> int:
    """Pinned host RAM: a KV host pool and, for hybrid models, a Mamba host pool, both from ratio or size."""
    if size_gb > 0:
        return int(size_gb * 1e9) * (2 if is_hybrid else 1)
    kv_host = m.kv_tokens * m.kv_bytes_per_token
    return int(ratio * kv_host) + (int(ratio * m.mamba_slots * m.state_bytes_per_request) if is_hybrid else 0)


def _size_vllm(ask: Ask) -> Sizing:
    memory, errors = size_vllm(
        ask.shape, ask.args, ask.rules, tp=ask.tp, free_bytes=ask.free_bytes, total_bytes=ask.total_bytes
    )
    warnings = (
        Issue(
            "estimate",
            "vLLM activation and CUDA-graph memory are estimates; vLLM profiles them at "
            "start (log: 'Available KV cache memory')",
        ),
    )
    return Sizing(memory, tuple(errors), warnings, {"gpu_memory_utilization": memory.mem_fraction_static})


SIZERS: dict[str, Callable[[Ask], Sizing]] = {"sglang": _size_sglang, "vllm": _size_vllm}


def size(engine: str, ask: Ask) -> Sizing:
    """Size one instance with its engine's rules (`--quantization fp8` of 16-bit weights: one byte each)."""
    if can_quantize_fp8(ask) and ask.args.get("quantization") == "fp8":
        shape = ask.shape
        fp8 = replace(
            shape, weight_bytes=shape.weight_bytes // 2, mtp_weight_bytes=shape.mtp_weight_bytes // 2
        )
        ask = replace(ask, shape=fp8)
    return _weights_first(SIZERS[engine](ask), ask)


def can_quantize_fp8(ask: Ask) -> bool:
    """Online FP8 quantisation (SGLang's and vLLM's `--quantization fp8`) halves 16-bit weights that are not
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
            f"(memory fraction {m.mem_fraction_static:.3f}): nothing is left for the KV cache"
        )
    issue = Issue("weights-exceed-gpu", text, WEIGHTS_FIX)
    empty = replace(
        m,
        rest_bytes=0,
        mamba_slots=0,
        mamba_pool_bytes=0,
        spec_scratch_bytes=0,
        kv_pool_bytes=0,
        kv_tokens=0,
        max_running_requests=0,
    )
    others = tuple(e for e in sized.errors if e.rule not in CONSEQUENCES)
    return replace(sized, memory=empty, errors=(issue, *others))


def gpu_of(inst: InstanceSpec, gpus: Mapping[int, GpuFacts]) -> tuple[GpuFacts | None, list[Issue]]:
    """The binding GPU of an instance (least free memory over its TP group), or the indices missing."""
    missing = [g for g in inst.gpus if g not in gpus]
    if missing:
        have = ", ".join(str(i) for i in sorted(gpus)) or "none"
        return None, [
            Issue(
                "gpu-absent",
                f"{inst.name}: GPU {', '.join(map(str, missing))} is not on host "
                f"{inst.host} (it has: {have})",
                "list only GPUs the host has in hosts[].gpus",
            )
        ]
    return min((gpus[g] for g in inst.gpus), key=lambda g: g.free_bytes), []


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


def decide_launch(
    spec: EngineSpec, inst: InstanceSpec, facts: HostFacts, version: str | None = None
) -> Launch:
    """THE place an instance's argv and env are decided: `plan` shows them and `up` launches them.

    From the fleet file's engine section, the instance, and the engine version the host runs (`facts`, as
    measured), else `version`, else `engine.version`. The model shape and GPU facts size the plan but
    change no flag: fleetgen launches what the user wrote (a plan's fixes are suggestions).
    """
    engine = get_engine(spec.kind)
    chosen = facts.engine_version or version or spec.version
    rules, warning = select_rule_set(engine.rule_sets, chosen)
    args = engine.build_argv(spec, inst, model_path=spec.model, host_bind=spec.bind, rules=rules)
    if spec.is_public and spec.api_key_env and not engine.api_key_env_var and engine.api_key_config_flag:
        args = [*args, engine.api_key_config_flag, API_KEY_CONFIG]
    argv = (spec.python, *launcher_of(spec), *args)
    return Launch(argv, engine.build_env(spec, inst), rules, chosen, warning)
