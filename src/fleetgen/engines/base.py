"""The `Engine` protocol and the value types every engine module shares.

An engine module (`sglang.py`, `vllm.py`) knows one inference server: how to turn an instance into argv +
env, which endpoints and metric names it serves, which log lines mean "ready" or "dead", and — per release
era — which flags exist (`RuleSet`, which each engine extends with its own switches). Pure: no I/O, no env
vars, no clock.

What every engine shares: argv layout, env, the parser-check frame and verdict, common fatal signatures,
`capacity` (its start-up log's figures, to which an engine adds what its info JSON or /metrics labels
report), `decode_rate` over a window (its token counter; SGLang: its gauge) and `with_simulated_acceptance`
(tune's forced accept length; what `simulated_acceptance` finds). A release's flags: `engines.rules`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgen.config import ArgValue, EngineConfig, Instance
from fleetgen.engines.rules import RuleSet, translate_args


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
    """Prometheus metric names of one engine (`*_total`: counters). Empty string: it has none (derive it)."""

    running: str
    queued: str
    gen_throughput: str = ""
    generation_tokens_total: str = ""
    kv_usage: str = ""
    # a counter that moves on every speculative verify step (proof that speculation runs)
    spec_steps_total: str = ""
    accept_length: str = ""  # a gauge of the mean tokens per speculative step (SGLang)
    spec_accepted_total: str = ""  # a counter of accepted draft tokens (vLLM: the accept length's numerator)
    capacity_info: str = ""  # an info-style sample whose labels carry capacity figures (vLLM's cache config)

    @property
    def read(self) -> tuple[str, ...]:
        """Every sample name fleetgen reads of this engine: the only families `http.metrics` parses."""
        return tuple(name for name in dataclasses.astuple(self) if name)

    @property
    def moving(self) -> tuple[str, ...]:
        """The samples that change while the engine generates anything: its token and verify-step counters,
        and the throughput and KV gauges its scheduler sets as it steps (SGLang adds a request's tokens to
        its counter only when it ends, but sets the gauges every few dozen decode steps). None of them
        changing between two reads while requests are in flight is no progress (the job's hung guard)."""
        names = (self.generation_tokens_total, self.spec_steps_total, self.gen_throughput, self.kv_usage)
        return tuple(name for name in names if name)

    @classmethod
    def of(cls, engine: str, **names: Any) -> MetricNames:
        """`names`, and the token counter every engine exports (`<engine>:generation_tokens_total`)."""
        return cls(**names, generation_tokens_total=f"{engine}:generation_tokens_total")


@dataclass(frozen=True)
class ParserVerdict:
    """What the engine's own argument parser said about an argv (run on the host with its python)."""

    is_ok: bool
    version: str = ""
    error: str = ""
    resolved: Mapping[str, object] = field(default_factory=dict)


def common_fatal_signatures(oom_fix: str) -> tuple[FatalSignature, ...]:
    """The log lines every engine dies with: GPU out of memory (`oom_fix` names the engine's own flags),
    the CUDA runtime failed, the port is taken."""
    return (
        # torch's OOM message lists the other processes on the GPU ("Process 5058 has 93.64 GiB memory in
        # use"): then the engine's flags are not the cause (seen on the H200: a stranger took the GPU after
        # `up` measured it free).
        FatalSignature(
            r"(CUDA out of memory|OutOfMemoryError).*\bProcess \d+ has [\d.]+ [KMGT]iB memory in use",
            "GPU out of memory: another process holds memory on this GPU (the pid is in the line below)",
            "stop that process or deploy to other GPUs (`nvidia-smi` on the host shows who holds what); "
            "`fleetgen plan` sizes with the memory free when it runs",
        ),
        FatalSignature(  # torch's allocator says "CUDA out of memory"; the CUDA runtime, in a graph's
            # capture, "CUDA error: out of memory" (cudaErrorMemoryAllocation)
            r"(CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|CUDA error: out of memory)",
            "GPU out of memory",
            oom_fix,
        ),
        FatalSignature(
            r"CUDA error|cudaErrorNoDevice|no CUDA-capable device",
            "the CUDA runtime failed",
            "check nvidia-smi and the driver on the host",
        ),
        FatalSignature(
            r"Address already in use", "the port is taken", "stop what listens there or change base_port"
        ),
    )


def refused_argument_signatures(who: str, flag_fix: str) -> tuple[FatalSignature, ...]:
    """The engine refused its arguments at start, or its parser refused a flag (every engine's last
    resort)."""
    return (
        FatalSignature(
            r"^(ValueError|AssertionError|RuntimeError): ",
            f"{who} refused its arguments at start",
            "read the message; `fleetgen plan` checks the argv with the host's own parser",
        ),
        FatalSignature(
            r"error: (unrecognized arguments|argument --\S+: )", f"{who}'s parser rejected a flag", flag_fix
        ),
    )


# Each /metrics sample name's first label set (where an info-style metric carries its figures).
Labels = Mapping[str, Mapping[str, str]]


def positive_figures(places: Sequence[Any], keys: Sequence[tuple[str, str]]) -> dict[str, float]:
    """The figures `keys` name (key → figure) in the mappings among `places`, where positive numbers; a later
    place wins."""
    found: dict[str, float] = {}
    for place in places:
        for key, what in keys:
            try:
                value = float(place[key])
            except (KeyError, TypeError, ValueError):
                continue
            if value > 0:
                found[what] = value
    return found


class Engine:
    """One inference engine: an engine module subclasses it, sets every attribute below and registers an
    instance in `fleetgen.engines`. Nothing outside `engines/` branches on an engine's name; it asks this."""

    name: str
    default_launcher: tuple[str, ...]  # what runs it after python (`-m sglang.launch_server`)
    distributions: tuple[str, ...]  # Python distributions that provide it, tried in order (its version)
    health_path = "/health"
    info_paths: tuple[str, ...] = ()  # its own view of its settings (JSON), first that answers
    # flags whose effect the info JSON shows, each by its names (old, new), under the name with `_` for `-`
    view_checks: tuple[tuple[str, ...], ...] = ()
    view_keys: tuple[str, ...] = ()  # an info JSON holding one of these keys is its view (checked against)
    view_aliases: tuple[tuple[str, str], ...] = ()  # values the engine rewrites before it reports them
    metrics_path = "/metrics"
    metrics: MetricNames
    # capacity figures in its start-up log: (figure, regex whose group 1 is the number)
    capacity_lines: tuple[tuple[str, str], ...] = ()
    fatal_signatures: tuple[FatalSignature, ...]
    rule_sets: tuple[RuleSet, ...]
    api_key_flag = "--api-key"
    # An env var the engine reads its API key from, when it has one: the key then stays off the argv, which
    # any user of the host can read with `ps` (/proc/PID/environ is readable by the owner only).
    api_key_env_var: str | None = None
    # Else the flag naming a YAML config file the engine reads flags from (`api-key: KEY` in a 0600 file).
    api_key_config_flag: str | None = None
    # --- argv: `[model] engine.args [--model-flag model] --tp-flag N --host H --port P [--served-model-name]`
    model_flag: str | None = None  # None: the model path is the first (positional) argument
    tp_flag: str
    context_flag: str  # the flag (no dashes) that caps one request's tokens, the model's length by default
    max_running_flags: tuple[str, ...] = ()  # flags (no dashes) that cap the capacity's max_running_requests
    parser_body: str  # its own parser, run inside `parser_check_script` (reads `argv`, fills `out`)

    def build_argv(self, cfg: EngineConfig, inst: Instance, rules: RuleSet) -> list[str]:
        """The engine's arguments (after python + launcher): `engine.args` (renamed flags translated for
        `rules`' era), then model, TP, bind, port, served name and the engine's `extra_argv`."""
        args = translate_args(cfg.args, rules).args
        argv = [cfg.model] if self.model_flag is None else []
        argv += format_args(args)
        if self.model_flag is not None:
            argv += [self.model_flag, cfg.model]
        argv += [self.tp_flag, str(cfg.tp), "--host", cfg.bind, "--port", str(inst.port)]
        if cfg.served_model_name:
            argv += ["--served-model-name", cfg.served_model_name]
        return argv + self.extra_argv(args)  # a public bind's key never goes on the argv (deploy.wanted)

    def extra_argv(self, args: Mapping[str, ArgValue | list[ArgValue]]) -> list[str]:
        """Flags fleetgen adds after its own, given the (translated) `engine.args`."""
        return []

    def build_env(self, cfg: EngineConfig, inst: Instance) -> dict[str, str]:
        """`engine.env` plus CUDA_VISIBLE_DEVICES for the instance's GPUs."""
        return {**cfg.env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in inst.gpus)}

    def capacity(self, log: Sequence[str], info: Any, labels: Labels) -> dict[str, float]:
        """The capacity it settled on, from its start-up log (`capacity_lines`; the last occurrence wins); an
        engine adds what its info JSON or the `labels` of its /metrics samples report, which win."""
        found: dict[str, float] = {}
        for line in log:
            for what, pattern in self.capacity_lines:
                if match := re.search(pattern, line):
                    found[what] = float(match.group(1).replace(",", ""))
        return found

    def max_running_from_info(self, info: Any) -> int | None:
        """The concurrency it settled on, as its info JSON says; None where it does not say (vLLM)."""
        return None

    def max_running_from_capacity(self, capacity: Mapping[str, float], cap: str | None) -> int | None:
        """The concurrency its `capacity` figures allow under `cap` (the value of its `max_running_flags` in
        the argv); None where they do not say (SGLang: its info JSON says)."""
        return None

    def running_is_floor(self, cap: str | None) -> bool:
        """Whether the concurrency from its capacity figures under `cap` is a floor it runs past (vLLM's at
        max-model-len, without max-num-seqs), not a cap: `run` then fills its batch (`dispatch.refilled`)."""
        return False

    def decode_rate(self, window: Sequence[tuple[float, Mapping[str, float]]]) -> float | None:
        """Its output tokens per second over a window of /metrics reads (monotonic seconds, samples), as its
        counter of generated tokens rose from the first read to the last (vLLM counts every step's); None
        without two reads apart or the counter."""
        name = self.metrics.generation_tokens_total
        if len(window) < 2 or name not in window[0][1] or name not in window[-1][1]:
            return None
        (t0, first), (t1, last) = window[0], window[-1]
        rise = last[name] - first[name]
        return rise / (t1 - t0) if t1 > t0 and rise >= 0 else None

    def accept_length(self, samples: Mapping[str, float], info: Any = None) -> float | None:
        """Mean tokens per speculative step (bonus included) from its /metrics `samples` (over a window when
        they are `http.metrics.counter_deltas`), else its `info` JSON; None when no step happened (or spec
        is off)."""
        return None

    def simulated_acceptance(self, argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        """The settings in a launch's `argv` (its flags) and `env` that make the engine commit tokens the
        model did not choose (a forced speculative acceptance, for throughput measurement only), each as
        written there (`NAME=value`, `--flag key=value`); none by default. `up` and `run` refuse a fleet
        carrying any (`deploy.wanted.refuse_simulated_acceptance`)."""
        return ()

    def with_simulated_acceptance(
        self, args: Mapping[str, ArgValue | list[ArgValue]], env: Mapping[str, str], length: float
    ) -> tuple[dict[str, ArgValue | list[ArgValue]], dict[str, str]] | None:
        """`args` and `env` made to accept `length` tokens per speculative step whatever the model says (for
        a throughput measurement on weights that draft nothing useful: `tune --simulate-accept-length`);
        None where the engine has no such setting. What it sets, `simulated_acceptance` finds."""
        return None

    def rejection_signatures_for(self, rules: RuleSet) -> tuple[FatalSignature, ...]:
        """Its refusals of an argv at start (what plan's rules predict), in its words, each with the fix for
        the release `rules` was read from (the fix `plan` gives); none by default."""
        return ()

    def fatal_signatures_for(self, rules: RuleSet) -> tuple[FatalSignature, ...]:
        """Every log line it dies with under `rules`' release: its rejections first (most specific), then
        `fatal_signatures`."""
        return (*self.rejection_signatures_for(rules), *self.fatal_signatures)

    def parser_check_script(self) -> str:
        """Python source for the host's own python: the JSON argv on stdin goes through `parser_body` (the
        engine's parser: it reads `argv`, sets `out["version"]` and `out["resolved"]`, raises
        `_Refused(message)` for an argument error), then one marked JSON verdict line is printed (the engine's
        imports may log to stdout)."""
        body = textwrap.indent(textwrap.dedent(self.parser_body).strip("\n"), "    ")
        return _VERDICT_HEAD + body + _VERDICT_TAIL

    @staticmethod
    def parse_verdict(stdout: str) -> ParserVerdict:
        """The last `FLEETGEN_PARSER_VERDICT {json}` line `parser_check_script` printed."""
        for line in reversed(stdout.splitlines()):
            if line.startswith(VERDICT_MARK):
                data = json.loads(line[len(VERDICT_MARK) :])
                return ParserVerdict(
                    is_ok=bool(data.get("ok")),
                    version=str(data.get("version", "")),
                    error=str(data.get("error", "")),
                    resolved=dict(data.get("resolved") or {}),
                )
        return ParserVerdict(is_ok=False, error="the parser check printed no verdict: " + stdout[-500:])


VERDICT_MARK = "FLEETGEN_PARSER_VERDICT "
_VERDICT_HEAD = f"""
import json, sys
MARK = {VERDICT_MARK!r}
argv = json.loads(sys.stdin.read())
out = {{"ok": False, "version": "", "error": "", "resolved": {{}}}}
class _Refused(Exception):
    pass
try:
"""
_VERDICT_TAIL = """
    out["ok"] = True
except _Refused as exc:
    out["error"] = "argument error: " + str(exc)
except BaseException as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
print(MARK + json.dumps(out, default=str))
"""


def format_args(args: Mapping[str, ArgValue | list[ArgValue]]) -> list[str]:
    """`--key value`; booleans as bare flags when true (omitted when false); lists as `--key v1 v2`."""
    argv: list[str] = []
    for key, value in args.items():
        if value is not False:
            values = [] if value is True else value if isinstance(value, list) else [value]
            argv += [f"--{key}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return argv
