"""SGLang's startup log, as 0.5.23 prints it, and its two ways of dying at startup.

Log format `[%(asctime)s] %(message)s` (`utils/common.py::configure_logger`). Lines reproduced:
`Load weight begin/end` (`model_runner.py`), `KV Cache is allocated. …` (`memory_pool.py::
_finalize_allocation_log`), `Mamba Cache is allocated. …` (`memory_pool.py`), `max_total_num_tokens=…`
(`scheduler.py`), uvicorn's lines, `The server is fired up and ready to roll!` (`http_server.py`).

Failures: a rule that fails during server-args resolution runs in the launcher process and ends in a plain
Python traceback and exit code 1. A failure while building the memory pools happens in the scheduler
subprocess: it logs `Scheduler hit an exception: <traceback>`, SIGQUITs the launcher, whose handler logs
`Received sigquit from a child process. It usually means the child failed.` and kills the whole process tree,
itself included, with SIGKILL (`engine.py::launch_phase_sigquit_handler` → `kill_process_tree`), so the
launcher's exit status is -9, not 1.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from fleetgen.sim.memory import Capacity
from fleetgen.sim.model import ModelShape
from fleetgen.sim.resolve import StartupRuleError

logger = logging.getLogger("sglang.srt")
SIMULATION_NOTICE = (
    "SIMULATION: this is fleetgen.sim, a simulated SGLang 0.5.23 server for tests and rehearsals. "
    "No model is loaded and no GPU is used; answers are synthetic."
)
READY_LINE = "The server is fired up and ready to roll!"
SITE = "/usr/local/lib/python3.11/site-packages/sglang"

# The launcher's frames down to the resolution pipeline, then the frame that raises (per rule).
_LAUNCH_FRAMES = (
    ('<frozen runpy>", line 198, in _run_module_as_main', None),
    ('<frozen runpy>", line 88, in _run_code', None),
    (f'{SITE}/launch_server.py", line 133, in <module>', "run_server(server_args)"),
    (f'{SITE}/launch_server.py", line 28, in run_server', "server_args.resolve_once()"),
    (f'{SITE}/srt/server_args.py", line 220, in resolve_once', "run_resolution_pipeline(self)"),
)
_RAISING_FRAMES = {
    "SpeculativeAlgorithm.from_string": ("srt/speculative/spec_info.py", 65, "raise ValueError("),
    "_handle_eagle_family": ("srt/arg_groups/speculative_hook.py", 1160, "raise ValueError("),
    "handle_mamba_radix_cache": ("srt/arg_groups/model_hook.py", 1063, "raise ValueError("),
    "validate_mamba_extra_buffer": (
        "srt/arg_groups/mamba_hook.py",
        133,
        "assert view.mamba_track_interval >= …",
    ),
    "validate_mamba_no_buffer": ("srt/arg_groups/mamba_hook.py", 158, "assert …"),
    "_derive_context_length": ("srt/configs/model_config.py", 1314, "raise ValueError("),
}


def configure_logging(level: str) -> None:
    """SGLang's log format on stderr."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )


def launcher_traceback(err: StartupRuleError) -> str:
    """The traceback Python prints when resolution raises in the launcher."""
    lines = ["Traceback (most recent call last):"]
    for frame, code in _LAUNCH_FRAMES:
        lines.append(f'  File "{frame}')
        if code:
            lines.append(f"    {code}")
    path, line, code = _RAISING_FRAMES.get(err.where, ("srt/arg_groups/pipeline.py", 1, "raise"))
    lines += [f'  File "{SITE}/{path}", line {line}, in {err.where.split(".")[-1]}', f"    {code}"]
    lines.append(f"{err.kind}: {err.text}" if err.text else err.kind)
    return "\n".join(lines)


def die_in_scheduler(kind: str, text: str, where: str) -> None:
    """A scheduler-side startup failure: SGLang's log lines, then the whole tree is SIGKILLed."""
    logger.error(
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        f'  File "{SITE}/srt/managers/scheduler.py", line 6361, in run_scheduler_process\n'
        "    scheduler = Scheduler(server_args, port_args)\n"
        f'  File "{SITE}/srt/mem_cache/kv_cache_configurator.py", line 3051, in {where}\n'
        f"    raise {kind}(\n"
        f"{kind}: {text}\n"
    )
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    logging.shutdown()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def log_weights(shape: ModelShape, cap_free_before: float, elapsed: float) -> None:
    """`Load weight end`, after `Load weight begin` was printed and the simulated load time passed."""
    logger.info(
        f"Load weight end. elapsed={elapsed:.2f} s, type={shape.architecture}, "
        f"avail mem={cap_free_before - shape.weights_gib:.2f} GB, mem usage={shape.weights_gib:.2f} GB."
    )


def log_draft_weights(shape: ModelShape, free_gib: float, draft_gib: float) -> None:
    """The draft model's own `Load weight begin/end` pair (type `<Arch>MTP`, e.g. Qwen3_5ForCausalLMMTP)."""
    arch = shape.architecture.replace("ForConditionalGeneration", "ForCausalLM") + "MTP"
    logger.info(f"Load weight begin. avail mem={free_gib:.2f} GB")
    logger.info(
        f"Load weight end. elapsed=0.01 s, type={arch}, avail mem={free_gib - draft_gib:.2f} GB, "
        f"mem usage={draft_gib:.2f} GB."
    )


def log_pools(cap: Capacity, args: dict[str, object], shape: ModelShape, num_draft_tokens: int) -> None:
    """The KV/Mamba pool lines and the scheduler's summary line."""
    dtype = (
        "torch.bfloat16" if args["kv_cache_dtype"] in ("auto", "bf16", "bfloat16") else "torch.float8_e4m3fn"
    )
    if shape.is_hybrid:  # the target's Mamba pool first, then its KV pool (real 0.5.15 order)
        message = (
            f"Mamba Cache is allocated. max_mamba_cache_size: {cap.mamba_cache_size}, "
            f"conv_state size: {cap.mamba_conv_gib:.2f}GB, ssm_state size: {cap.mamba_ssm_gib:.2f}GB "
        )
        if num_draft_tokens:
            message += f"intermediate_ssm_state_cache size: {cap.mamba_intermediate_gib:.2f}GB "
        logger.info(message)
    kv_line = (
        "KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, K size: {k:.2f} GB, V size: {v:.2f} GB"
    )
    logger.info(kv_line.format(dtype=dtype, tokens=cap.max_total_num_tokens, k=cap.kv_k_gib, v=cap.kv_v_gib))
    if num_draft_tokens:  # the MTP draft worker's own one-layer KV pool, same #tokens: a second line
        share = max(1, shape.mtp_layers) / max(1, shape.num_full_attention_layers)
        k, v = cap.kv_k_gib * share, cap.kv_v_gib * share
        logger.info(kv_line.format(dtype=dtype, tokens=cap.max_total_num_tokens, k=k, v=v))
    for warning in cap.warnings:
        logger.warning(warning)
    logger.info(
        f"max_total_num_tokens={cap.max_total_num_tokens}, "
        f"chunked_prefill_size={args['chunked_prefill_size']}, "
        f"max_prefill_tokens={args['max_prefill_tokens']}, max_running_requests={cap.max_running_requests}, "
        f"context_len={args['context_length']}, available_gpu_mem={cap.free_after_pools_gib:.2f} GB"
    )


def log_http_started(host: str, port: int) -> None:
    """uvicorn's start lines (SGLang serves with uvicorn)."""
    for line in (
        f"INFO:     Started server process [{os.getpid()}]",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
        f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)",
    ):
        print(line, file=sys.stderr, flush=True)
