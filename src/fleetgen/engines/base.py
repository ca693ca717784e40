"""The `Engine` protocol and the value types every engine module shares.

An engine module (`sglang.py`, `vllm.py`) knows one inference server: how to turn an instance into argv +
env, which endpoints and metric names it serves, which log lines mean "ready" or "dead", and — per release
era — which flags exist and how it sizes GPU memory (`RuleSet`). Pure: no I/O, no env vars, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fleetgen.config import ArgValue, EngineSpec, InstanceSpec


@dataclass(frozen=True)
class FatalSignature:
    """A log line that means the engine will not come up: what it matched, why, and what to do."""

    pattern: str
    cause: str
    fix: str

    def search(self, line: str) -> re.Match[str] | None:
        return re.search(self.pattern, line)


@dataclass(frozen=True)
class MetricNames:
    """Prometheus metric names of one engine. Empty string: the engine has no such gauge (derive it)."""

    running: str
    queued: str
    gen_throughput: str = ""
    generation_tokens_total: str = ""
    prompt_tokens_total: str = ""
    spec_accept_length: str = ""
    spec_num_drafts_total: str = ""
    spec_num_accepted_tokens_total: str = ""
    kv_usage: str = ""


@dataclass(frozen=True)
class FlagRename:
    """A flag renamed between releases. `new` lists the replacement(s); the first is the translation."""

    old: str
    new: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class RuleSet:
    """How one release era of an engine validates flags and sizes memory (facts from that release's source).

    Names are flag names without dashes. `renames` map names of OTHER eras to this era's names.
    """

    name: str
    engine: str
    min_version: tuple[int, ...]
    max_version: tuple[int, ...]
    strategy_flag: str = ""
    renames: tuple[FlagRename, ...] = ()
    removed_flags: Mapping[str, str] = field(default_factory=dict)
    # --- SGLang memory semantics -------------------------------------------------------------------
    refuses_spec_no_buffer_radix: bool = (
        False  # ValueError at start (early 2026) instead of a silent fallback
    )
    spec_v2_env: str = ""  # env var that selects the overlap (v2) spec worker, "" when it no longer exists
    spec_v2_default: bool = False
    spec_reserve_mb: int = 0  # extra headroom the default mem-fraction formula keeps for EAGLE/MTP
    draft_weights_in_budget: bool = False
    draft_kv_in_budget: bool = False
    joint_mamba_spec_solve: bool = False
    auto_strategy_extra_buffer: bool = False  # `auto` resolves to extra_buffer when overlap is on
    default_spec_max_running: int = 48
    rejects_extra_buffer_without_radix: bool = False  # ValueError (early 2026); later releases ignore it
    explicit_no_buffer_needs_no_overlap: bool = False  # 0.5.23 asserts instead of turning overlap off
    # --- vLLM --------------------------------------------------------------------------------------
    default_gpu_memory_utilization: float = 0.9


@dataclass(frozen=True)
class ParserVerdict:
    """What the engine's own argument parser said about an argv (run on the host with its python)."""

    is_ok: bool
    version: str = ""
    error: str = ""
    resolved: Mapping[str, object] = field(default_factory=dict)


class Engine(Protocol):
    """One inference engine. Implementations are registered by name in `fleetgen.engines`."""

    name: str
    default_launcher: tuple[str, ...]
    health_path: str
    info_paths: tuple[str, ...]
    metrics_path: str
    metrics: MetricNames
    ready_line: str
    fatal_signatures: tuple[FatalSignature, ...]
    rule_sets: tuple[RuleSet, ...]
    api_key_flag: str

    def build_argv(
        self,
        spec: EngineSpec,
        inst: InstanceSpec,
        *,
        model_path: str,
        host_bind: str,
        rules: RuleSet | None = None,
    ) -> list[str]:
        """The engine's arguments (after python + launcher): `engine.args` verbatim, then fleetgen's own."""
        ...

    def build_env(self, spec: EngineSpec, inst: InstanceSpec) -> dict[str, str]:
        """`engine.env` plus CUDA_VISIBLE_DEVICES for the instance's GPUs."""
        ...

    def parser_check_script(self) -> str:
        """Python source: reads a JSON argv on stdin, runs the engine's own parser, prints a JSON verdict."""
        ...

    def parse_verdict(self, stdout: str) -> ParserVerdict:
        """Read what `parser_check_script` printed."""
        ...


def parse_version(text: str) -> tuple[int, ...]:
    """`0.5.10.post1` → (0, 5, 10); `0.32.0+cpu` → (0, 32, 0). Non-numeric parts end the tuple."""
    parts: list[int] = []
    for piece in re.split(r"[.+-]", text.strip().lstrip("v")):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


def select_rule_set(rule_sets: Sequence[RuleSet], version: str | None) -> tuple[RuleSet, str | None]:
    """The rule set covering `version`, or the nearest one with a warning saying so."""
    latest = max(rule_sets, key=lambda r: r.max_version)
    if not version:
        return (
            latest,
            f"engine version unknown: planning with the {latest.name} rules (the newest known); "
            "set engine.version or run without --offline so it is detected",
        )
    wanted = parse_version(version)
    for rules in rule_sets:
        if rules.min_version <= wanted <= rules.max_version:
            return rules, None
    nearest = min(rule_sets, key=lambda r: _distance(wanted, r))
    return nearest, (
        f"no rule set for {version}: using the nearest, {nearest.name} "
        f"({_fmt(nearest.min_version)}–{_fmt(nearest.max_version)}); its sizing may differ"
    )


def _distance(wanted: tuple[int, ...], rules: RuleSet) -> tuple[int, ...]:
    edge = rules.min_version if wanted < rules.min_version else rules.max_version
    width = max(len(wanted), len(edge))
    a = wanted + (0,) * (width - len(wanted))
    b = edge + (0,) * (width - len(edge))
    return tuple(abs(x - y) for x, y in zip(a, b, strict=True))


def _fmt(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


@dataclass(frozen=True)
class Translation:
    """`engine.args` after renames for one rule set, and what was changed (for the plan's warnings)."""

    args: dict[str, ArgValue | list[ArgValue]]
    renamed: tuple[tuple[str, str], ...] = ()


def translate_args(args: Mapping[str, ArgValue | list[ArgValue]], rules: RuleSet | None) -> Translation:
    """Rewrite flags renamed in `rules`' era to the names that era accepts (first replacement)."""
    if rules is None:
        return Translation(dict(args))
    table = {r.old: r.new[0] for r in rules.renames}
    out: dict[str, ArgValue | list[ArgValue]] = {}
    renamed: list[tuple[str, str]] = []
    for key, value in args.items():
        new = table.get(key, key)
        if new != key:
            renamed.append((key, new))
        out[new] = value
    return Translation(out, tuple(renamed))


def format_args(args: Mapping[str, ArgValue | list[ArgValue]]) -> list[str]:
    """`--key value`; booleans as bare flags when true (omitted when false); lists as `--key v1 v2`."""
    argv: list[str] = []
    for key, value in args.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *(_scalar(v) for v in value)]
        else:
            argv += [flag, _scalar(value)]
    return argv


def _scalar(value: ArgValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def cuda_visible_devices(inst: InstanceSpec) -> str:
    return ",".join(str(g) for g in inst.gpus)


def api_key_reference(spec: EngineSpec) -> str:
    """The API key as a shell reference (`${NAME}`): the launch script expands it on the host, so the key
    itself never lands in fleetgen's files, plans or logs."""
    return f"${{{spec.api_key_env}}}"
