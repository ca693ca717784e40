"""SGLang: argv, env, endpoints, log signatures and the rule sets of the releases fleetgen knows.

Facts come from SGLang's own source of each release (`pip download --no-deps sglang==X`); the error texts
below are copied from it so a plan can quote what the engine would say at start.

Also here: its distributions, `/server_info` view checks, capacity figures, max running and accept length,
and the parser-check body. The startup rejections' log signatures carry the release's fix, from the same
source `plan.sglang.rules` uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fleetgen.config import ArgValue
from fleetgen.engines.base import (
    Engine,
    FatalSignature,
    Labels,
    MetricNames,
    common_fatal_signatures,
    positive_figures,
    refused_argument_signatures,
)
from fleetgen.engines.rules import RuleSet
from fleetgen.engines.sglang_timeline import RULE_SETS
from fleetgen.engines.sglang_timeline import MambaRatioRule as MambaRatioRule  # re-exported: the plan's
from fleetgen.engines.sglang_timeline import MaxRunningCap as MaxRunningCap
from fleetgen.engines.sglang_timeline import SGLangRules as SGLangRules  # re-exported: the plan's
from fleetgen.engines.sglang_timeline import sglang_rules as sglang_rules

# Exact texts from SGLang's source (see the reference, §2), used by the plan and by the deploy log watcher.
SPEC_NO_BUFFER_RADIX = (
    "Speculative decoding for {arch} is not compatible with radix cache when using "
    "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
    "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
)
EXTRA_BUFFER_NO_RADIX = (
    "mamba extra_buffer is not compatible with --disable-radix-cache Overlap scheduling is already supported "
    "with no_buffer + disable_radix_cache. Please use --mamba-scheduler-strategy no_buffer instead."
)
HICACHE_NO_RADIX = "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive"
TRACK_INTERVAL = "mamba_track_interval {x} must be greater than or equal to speculative_num_draft_tokens {y}"
HICACHE_HOST_MEMORY = (
    "Not enough host memory available. Requesting {req:.2f} GB but only have {avail:.2f} GB free. "
    "Please reduce the size of the hierarchical cache."
)
NOT_ENOUGH_MEMORY = (
    "Not enough memory. Please try to increase --mem-fraction-static. "
    "Current value: mem_fraction_static={mfs}"
)
MAMBA_TOO_SMALL = (
    "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
    "max_mamba_cache_size={size}"
)
SPEC_RADIX_DISABLED = (
    "Disabling radix cache since speculative decoding for {arch} is not supported with radix cache yet."
)
NO_BUFFER_OVERLAP = "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
NO_BUFFER_PAGE = "no_buffer only supports page_size=1."
SPEC_V2_REMOVED = (
    "SGLANG_ENABLE_SPEC_V2 has been removed: speculative decoding always runs the V2 worker. "
    "Use --disable-overlap-schedule to select the non-overlap (synchronous) path."
)
WEIGHTS_LEAVE_NOTHING = (
    "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mfs}."
)


def extra_buffer_fix(rules: SGLangRules) -> str:
    """The way out of spec + no_buffer + radix cache under `rules`, given by plan's rule and by the log
    watcher alike: the extra_buffer strategy (under the release's flag name), plus SGLANG_ENABLE_SPEC_V2=1
    only where the release reads it and it is off by default (before 0.5.11; 0.5.14 removed it)."""
    needs_env = rules.spec_v2_env and not rules.spec_v2_default
    env = f' and engine.env {rules.spec_v2_env} = "1"' if needs_env else ""
    alt = " (or disable-radix-cache = true: no prefix reuse)"
    return f'set engine.args {rules.strategy_flag} = "extra_buffer"{env}{alt}'


def no_buffer_overlap_fix(rules: SGLangRules) -> str:
    """The way out of explicit no_buffer with the overlap scheduler on (plan's rule and the log watcher)."""
    return f'set engine.args {rules.strategy_flag} = "extra_buffer" or disable-overlap-schedule = true'


def extra_buffer_no_radix_fix(rules: SGLangRules) -> str:
    return f'remove disable-radix-cache, or set engine.args {rules.strategy_flag} = "no_buffer"'


NO_BUFFER_PAGE_FIX = "remove page-size or use extra_buffer"
HICACHE_NO_RADIX_FIX = "remove one of the two flags"


def _server_info_places(info: Any) -> list[Any]:
    """Where /server_info keeps figures: its top level, `scheduler_info`, each DP rank's `internal_states`."""
    view = info if isinstance(info, dict) else {}
    states = view.get("internal_states")
    return [view, view.get("scheduler_info") or {}, *(states if isinstance(states, list) else [])]


class SGLangEngine(Engine):
    """SGLang behind the `Engine` interface."""

    name = "sglang"
    default_launcher: tuple[str, ...] = ("-m", "sglang.launch_server")
    distributions: tuple[str, ...] = ("sglang",)
    info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    view_checks: tuple[tuple[str, ...], ...] = (  # /server_info holds ServerArgs: the flag's fields
        ("speculative-algorithm",),
        ("speculative-num-steps",),
        ("speculative-eagle-topk",),
        ("speculative-num-draft-tokens",),
        ("mamba-radix-cache-strategy", "mamba-scheduler-strategy"),
        ("mem-fraction-static",),
        ("max-running-requests",),
    )
    view_keys: tuple[str, ...] = ("model_path", "mem_fraction_static", "internal_states")
    view_aliases: tuple[tuple[str, str], ...] = (("NEXTN", "EAGLE"),)  # NEXTN is reported as EAGLE
    metrics = MetricNames.of(
        name,
        running="sglang:num_running_reqs",
        queued="sglang:num_queue_reqs",
        gen_throughput="sglang:gen_throughput",
        kv_usage="sglang:token_usage",
        spec_steps_total="sglang:spec_verify_calls_total",
        accept_length="sglang:spec_accept_length",
    )
    capacity_lines: tuple[tuple[str, str], ...] = (  # the scheduler's and the memory pools' lines
        ("kv_tokens", r"max_total_num_tokens=(\d+)"),
        ("kv_tokens", r"KV Cache is allocated\..*#tokens: (\d+)"),
        ("max_running_requests", r"max_running_requests=(\d+)"),
        ("mamba_slots", r"Mamba Cache is allocated\..*?(?:max_mamba_cache_size|#slots|size)[:=] ?(\d+)"),
    )
    # The signatures whose fixes do not depend on the release (`SGLangEngine.fatal_signatures_for` adds the
    # rejections before them).
    fatal_signatures: tuple[FatalSignature, ...] = (
        FatalSignature(
            r"Not enough memory\. Please try to increase --mem-fraction-static",
            "no GPU memory left for the KV cache",
            "raise mem-fraction-static, lower context or use tp = 2",
        ),
        FatalSignature(
            r"Loaded weights leave no GPU memory for the KV cache",
            "the weights (target + draft) exceed the static budget",
            "raise mem-fraction-static or tp",
        ),
        FatalSignature(
            r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache",
            "the Mamba state pool does not fit",
            "max-mamba-cache-size, mamba-ssm-dtype bfloat16, or tp",
        ),
        FatalSignature(
            r"Hybrid \(mamba/linear-attention\) state cache is too small to serve any requests",
            "the Mamba pool holds no running request",
            "raise max-mamba-cache-size or mem-fraction-static",
        ),
        FatalSignature(
            r"Not enough host memory available\. Requesting",
            "the hierarchical cache asks for more pinned host RAM than there is",
            "lower hicache-size / hicache-ratio",
        ),
        FatalSignature(
            r"Capture cuda graph failed",
            "CUDA-graph capture ran out of memory",
            "lower mem-fraction-static or cuda-graph-max-bs-decode",
        ),
        FatalSignature(
            r"The memory capacity is unbalanced",
            "another process holds memory on one of the GPUs",
            "free the GPU (nvidia-smi) or pick other GPUs",
        ),
        *common_fatal_signatures(
            "lower mem-fraction-static (`fleetgen plan --job` names the largest safe one), context length or "
            "max-running-requests"
        ),
        *refused_argument_signatures(
            "the engine", "check the flag names for this SGLang version (`fleetgen plan` names the renames)"
        ),
    )
    rule_sets: tuple[SGLangRules, ...] = RULE_SETS
    # SGLang reads its key from no env var, only from `--api-key` (argv: public to `ps`) or from a
    # `--config` YAML file (every release 0.5.7…0.5.23: server_args.py prepare_server_args →
    # ConfigArgumentMerger, in-process, so /proc shows only `--config PATH`).
    api_key_config_flag: str | None = "--config"
    model_flag = "--model-path"
    tp_flag = "--tp-size"
    context_flag = "context-length"
    # Runs on the host with its own python: the exact parser `sglang.launch_server` uses, then from_cli_args.
    parser_body = """
        import argparse
        import sglang
        out["version"] = getattr(sglang, "__version__", "")
        from sglang.srt.server_args import ServerArgs
        class _Parser(argparse.ArgumentParser):
            def error(self, message):
                raise _Refused(message)
        parser = _Parser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args(argv)
        args = ServerArgs.from_cli_args(ns)
        keep = ("mem_fraction_static", "mamba_radix_cache_strategy", "mamba_scheduler_strategy",
                "speculative_algorithm", "speculative_num_draft_tokens", "max_running_requests",
                "tp_size", "context_length", "port", "host")
        out["resolved"] = {k: getattr(args, k) for k in keep if hasattr(args, k)}
    """

    def rejection_signatures_for(self, rules: RuleSet) -> tuple[FatalSignature, ...]:
        """SGLang's refusals of its arguments at start (what `plan.sglang.rules` predicts), as its log and its
        own parser say them, with the fix for `rules`' release."""
        rules = sglang_rules(rules)
        return (
            FatalSignature(
                r"Speculative decoding for \S+ is not compatible with radix cache",
                "speculative decoding with radix cache needs the extra_buffer Mamba strategy",
                extra_buffer_fix(rules),
            ),
            FatalSignature(
                r"mamba extra_buffer is not compatible with --disable-radix-cache",
                "extra_buffer needs the radix cache",
                extra_buffer_no_radix_fix(rules),
            ),
            FatalSignature(
                r"enable-hierarchical-cache and disable-radix-cache are mutually exclusive",
                "hierarchical cache needs the radix cache",
                HICACHE_NO_RADIX_FIX,
            ),
            FatalSignature(
                r"mamba_track_interval \d+ must be greater than or equal to speculative_num_draft_tokens",
                "the Mamba track interval is shorter than the draft",
                "raise mamba-track-interval",
            ),
            FatalSignature(
                re.escape(NO_BUFFER_OVERLAP),
                "the no_buffer Mamba strategy runs without the overlap scheduler",
                no_buffer_overlap_fix(rules),
            ),
            FatalSignature(
                re.escape(NO_BUFFER_PAGE), "the no_buffer Mamba strategy pages by 1", NO_BUFFER_PAGE_FIX
            ),
        )

    def capacity(self, log: Sequence[str], info: Any, labels: Labels) -> dict[str, float]:
        """Its log's figures, then /server_info's (`_server_info_places`: last wins)."""
        keys = (
            ("max_total_num_tokens", "kv_tokens"),
            ("max_mamba_cache_size", "mamba_slots"),
            ("effective_max_running_requests_per_dp", "max_running_requests"),
        )
        return super().capacity(log, info, labels) | positive_figures(_server_info_places(info), keys)

    def max_running_from_info(self, info: Any) -> int | None:
        """The effective per-DP-rank value, else the server arg `max_running_requests`."""
        keys = (("max_running_requests", "n"), ("effective_max_running_requests_per_dp", "n"))
        found = positive_figures(_server_info_places(info), keys).get("n")
        return int(found) if found else None

    def decode_rate(self, window: Sequence[tuple[float, Mapping[str, float]]]) -> float | None:
        """The `sglang:gen_throughput` gauge averaged over the window's reads after the first (the scheduler
        sets it at each "Decode batch" line, over the steps since the last). Not the token counter: 0.5.15
        adds a request's tokens to `generation_tokens_total` when it finishes, so a window's rise from it
        lags the decode (biased low while the batch fills with long outputs)."""
        name = self.metrics.gen_throughput
        values = [samples[name] for _, samples in window[1:] if name in samples]
        return sum(values) / len(values) if values else None

    def accept_length(self, samples: Mapping[str, float], info: Any = None) -> float | None:
        """The `sglang:spec_accept_length` gauge, else `avg_spec_accept_length` in the DP ranks' internal
        states (the gauge reads 0 until its first "Decode batch" log line, and without speculation)."""
        if samples.get(self.metrics.accept_length, 0.0) > 0:
            return samples[self.metrics.accept_length]
        return positive_figures(_server_info_places(info), (("avg_spec_accept_length", "a"),)).get("a")

    def simulated_acceptance(self, argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        """`SGLANG_SIMULATE_ACC_LEN` above 0 overwrites each verify step's accept index (srt/speculative/
        spec_utils.py: "turn off if < 0"; eagle_utils.py: `if SIMULATE_ACC_LEN > 0`): the committed tokens
        are a fixed id or the draft's, not the model's. Its companions `_METHOD` and `_TOKEN_MODE` are named
        with it (inert alone). A value SGLang cannot read as a number is refused too: remove it either way."""
        length = env.get(SIMULATE_ACC_LEN)
        if length is None or _is_off(length):
            return ()
        return tuple(f"{name}={env[name]}" for name in SIMULATE_ACC_ENV if name in env)

    def with_simulated_acceptance(
        self, args: Mapping[str, ArgValue | list[ArgValue]], env: Mapping[str, str], length: float
    ) -> tuple[dict[str, ArgValue | list[ArgValue]], dict[str, str]] | None:
        """`SGLANG_SIMULATE_ACC_LEN` in the env (read by the scheduler at each verify step)."""
        return dict(args), {**env, SIMULATE_ACC_LEN: f"{length:g}"}

    def extra_argv(self, args: Mapping[str, ArgValue | list[ArgValue]]) -> list[str]:
        # /metrics is off by default; fleetgen's live view reads it
        return [] if "enable-metrics" in args else ["--enable-metrics"]


SIMULATE_ACC_LEN = "SGLANG_SIMULATE_ACC_LEN"  # srt/environ.py: EnvFloat(-1)
SIMULATE_ACC_ENV = (SIMULATE_ACC_LEN, "SGLANG_SIMULATE_ACC_METHOD", "SGLANG_SIMULATE_ACC_TOKEN_MODE")


def _is_off(length: str) -> bool:
    """SGLang simulates only at a length > 0 (its default is -1; nan is not > 0 either)."""
    try:
        return not float(length) > 0
    except ValueError:
        return False
