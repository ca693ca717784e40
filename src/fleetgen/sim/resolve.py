"""Server-args resolution: SGLang 0.5.23's startup rules that matter to fleetgen, with its exact texts.

What the simulator reproduces (source: `arg_groups/*_hook.py`, `arg_groups/overrides.py`, `mamba_hook.py`):
- `--speculative-algorithm`: NEXTN/EAGLE → EAGLE; unknown names → `ValueError: Unknown speculative algorithm
  name: X`; EAGLE family: `max_running_requests` 48 by default, `(steps, topk, draft) = (3, 1, 4)` by default,
  draft tokens forced to steps+1 when topk == 1, `trtllm_mha` refuses topk > 1.
- hybrid archs with radix cache: strategy `auto` → `extra_buffer` when the overlap scheduler is on, else
  `no_buffer` (+ overlap off); `no_buffer` with overlap on, or page_size > 1 → AssertionError; extra_buffer
  needs `mamba_track_interval >= speculative_num_draft_tokens`; an explicit extra_buffer on a non-hybrid arch
  → ValueError. NOTE: 0.5.23 does NOT reject extra_buffer + `--disable-radix-cache` (the strategy is simply
  unused without radix cache; `mamba_extra_buffer_of` is false); earlier releases did.
- GPU-memory defaults (`memory_hook.py`): chunked_prefill_size, decode cuda-graph max bs, mem_fraction_static.

Failures raise `StartupRuleError(kind, text)`; `startup.py` prints them in the shape of a Python traceback.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fleetgen.sim.model import HYBRID_ARCHS, ModelShape

SPEC_ALGORITHMS = frozenset(
    {"DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NEXTN"}
)
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


class StartupRuleError(Exception):
    """A startup rule failed; `kind` is the Python exception type SGLang raises ("ValueError", …)."""

    def __init__(self, kind: str, text: str, where: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text
        self.where = where  # the SGLang function that raises it, for the traceback's last frame


@dataclasses.dataclass
class Resolution:
    """Resolved server args (SGLang field names) plus the log lines resolution printed."""

    args: dict[str, Any]
    warnings: list[str] = dataclasses.field(default_factory=list)
    infos: list[str] = dataclasses.field(default_factory=list)


def _gpu_memory_defaults(res: Resolution, gpu_mib: float) -> None:
    """`_handle_gpu_memory_settings`: chunked prefill, decode graph max bs, default mem_fraction_static."""
    args = res.args
    tp_small = args["tp_size"] < 4
    if gpu_mib < 20 * 1024:
        chunk, max_bs = 2048, 8
    elif gpu_mib < 35 * 1024:
        chunk, max_bs = 4096, 48 if tp_small else 160
    elif gpu_mib < 60 * 1024:
        chunk, max_bs = 4096, 32 if tp_small else 160
    elif gpu_mib < 160 * 1024:
        chunk, max_bs = 8192, 256 if tp_small else 512
    else:
        chunk, max_bs = 16384, 512
    if args["chunked_prefill_size"] is None:
        args["chunked_prefill_size"] = chunk
    if args["cuda_graph_max_bs_decode"] is None:
        args["cuda_graph_max_bs_decode"] = max_bs
    if args["mem_fraction_static"] is None:
        reserved = 512 + max(args["chunked_prefill_size"], 2048) * 1.5
        reserved += args["tp_size"] * args["pp_size"] / 8 * 1024 + args["cuda_graph_max_bs_decode"] * 2
        if gpu_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        args["mem_fraction_static"] = round((gpu_mib - reserved) / gpu_mib, 3)


def _speculative(res: Resolution, shape: ModelShape) -> None:
    """`handle_speculative_decoding` + `_handle_eagle_family` for the algorithms fleetgen plans."""
    args = res.args
    name = args["speculative_algorithm"]
    if name is None:
        return
    if name.upper() not in SPEC_ALGORITHMS:
        raise StartupRuleError(
            "ValueError", f"Unknown speculative algorithm name: {name}", "SpeculativeAlgorithm.from_string"
        )
    algo = "EAGLE" if name.upper() in ("NEXTN", "EAGLE") else name.upper()
    args["speculative_algorithm"] = algo
    if algo not in EAGLE_FAMILY:
        return
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 48
        res.warnings.append(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests."
        )
    if args["disable_overlap_schedule"]:
        res.warnings.append(
            "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."
        )
    _eagle_params(res, shape)


def _eagle_params(res: Resolution, shape: ModelShape) -> None:
    """Steps/topk/draft tokens: auto-chosen when steps is unset; draft = steps + 1 when topk == 1."""
    args = res.args
    if args["speculative_num_steps"] is None:
        if args["speculative_eagle_topk"] is not None or args["speculative_num_draft_tokens"] is not None:
            # SGLang asserts topk and draft tokens are unset when steps is (a bare `assert`).
            raise StartupRuleError("AssertionError", "", "_handle_eagle_family")
        steps, topk, draft = (5, 4, 8) if shape.architecture == "LlamaForCausalLM" else (3, 1, 4)
        args.update(
            speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=draft
        )
    topk = args["speculative_eagle_topk"] or 1
    args["speculative_eagle_topk"] = topk
    if args["attention_backend"] == "trtllm_mha" and topk > 1:
        raise StartupRuleError(
            "ValueError",
            "trtllm_mha backend only supports topk = 1 for speculative decoding.",
            "_handle_eagle_family",
        )
    if topk == 1 and args["speculative_num_draft_tokens"] != args["speculative_num_steps"] + 1:
        res.warnings.append(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
            "when speculative_eagle_topk == 1"
        )
        args["speculative_num_draft_tokens"] = args["speculative_num_steps"] + 1


def _mamba(res: Resolution, shape: ModelShape) -> None:
    """`_mamba_radix_cache_resolution` + `handle_mamba_radix_cache` validation."""
    args = res.args
    strategy = args["mamba_radix_cache_strategy"]
    uses_mamba_radix = shape.architecture in HYBRID_ARCHS and not args["disable_radix_cache"]
    if not uses_mamba_radix:
        if strategy in ("extra_buffer", "extra_buffer_lazy") and not args["disable_radix_cache"]:
            raise StartupRuleError(
                "ValueError",
                f"--mamba-radix-cache-strategy {strategy} needs mamba state, got {shape.architecture}.",
                "handle_mamba_radix_cache",
            )
        return
    if strategy == "auto":
        wants_paging = (args["page_size"] or 1) > 1
        if not args["disable_overlap_schedule"] or wants_paging:
            strategy = "extra_buffer"
        else:
            strategy, args["disable_overlap_schedule"] = "no_buffer", True
        args["mamba_radix_cache_strategy"] = strategy
    if strategy in ("extra_buffer", "extra_buffer_lazy"):
        draft = args["speculative_num_draft_tokens"]
        if draft is not None and args["mamba_track_interval"] < draft:
            raise StartupRuleError("AssertionError", "", "validate_mamba_extra_buffer")
        return
    checks = (
        (args["page_size"] in (1, None), "no_buffer only supports page_size=1."),
        (
            args["disable_overlap_schedule"],
            "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.",
        ),
        (args["attention_backend"] != "trtllm_mha", "no_buffer do not support trtllm_mha attention backend."),
    )
    for ok, text in checks:
        if not ok:
            raise StartupRuleError("AssertionError", text, "validate_mamba_no_buffer")


def resolve(raw: dict[str, Any], shape: ModelShape, gpu_gib: float) -> Resolution:
    """Resolve raw CLI values (argparse dests) as SGLang 0.5.23's pipeline would, for the simulated GPU."""
    res = Resolution(args=dict(raw))
    args = res.args
    if args["served_model_name"] is None:
        args["served_model_name"] = args["model_path"]
    if args["tokenizer_path"] is None:
        args["tokenizer_path"] = args["model_path"]
    if args["context_length"] is None:
        args["context_length"] = shape.context_len
    if args["random_seed"] is None:
        args["random_seed"] = 0  # SGLang draws one at random; a simulation stays reproducible
    if args["mamba_full_memory_ratio"] is None:
        args["mamba_full_memory_ratio"] = 0.9
    if args["page_size"] is None:
        args["page_size"] = 1
    if args["device"] is None:
        args["device"] = "cuda"
    _gpu_memory_defaults(res, gpu_gib * 1024)
    _speculative(res, shape)
    _mamba(res, shape)
    return res
