"""The simulated server's life: parse SGLang's flags, resolve, "load" and size the pools, serve, stop.

Timeline of `--sim-start-delay S`: 40 % loading weights (port closed, as in SGLang), 20 % building the
pools, then the HTTP port opens and 40 % warmup passes with `/health` answering 503, then the ready line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import sys
import time
from typing import Any

from aiohttp import web

from fleetgen.sim import startup
from fleetgen.sim.configfile import merge_config
from fleetgen.sim.engine import SimScheduler
from fleetgen.sim.flags import build_parser
from fleetgen.sim.memory import Capacity, MemoryInputs, compute_capacity
from fleetgen.sim.model import ModelShape, load_shape
from fleetgen.sim.resolve import Resolution, StartupRuleError, resolve
from fleetgen.sim.server import build_app
from fleetgen.sim.state import SimKnobs, SimState

logger = logging.getLogger("sglang.srt.entrypoints.engine")
SPEC_DESTS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def _split(values: dict[str, Any]) -> tuple[dict[str, Any], SimKnobs]:
    knobs = SimKnobs(**{k.removeprefix("sim_"): v for k, v in values.items() if k.startswith("sim_")})
    raw = {k: v for k, v in values.items() if not k.startswith("sim_")}
    if knobs.no_spec:
        # The flags were given (launch_command shows them) but speculative decoding never comes up.
        raw.update(dict.fromkeys(SPEC_DESTS))
    return raw, knobs


def sglang_argv(argv: list[str]) -> list[str]:
    """`argv` without the `--sim-*` knobs (and their values): what SGLang itself would have been given."""
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
        elif arg.startswith("--sim-"):
            skip_value = "=" not in arg and arg != "--sim-no-spec"
        else:
            kept.append(arg)
    return kept


def _context_rule(res: Resolution, shape: ModelShape, force: bool) -> None:
    """`ModelConfig._derive_context_length`: a longer --context-length than the model's is refused."""
    wanted = res.args["context_length"] if not force else shape.context_len * 2
    if wanted <= shape.context_len:
        return
    text = (
        f"Warning: User-specified context_length ({wanted}) is greater than the derived context_length "
        f"({shape.context_len}). This may lead to incorrect model outputs or CUDA errors. "
        "Note that the derived "
        f"context_length may differ from max_position_embeddings in the model's config."
    )
    if os.environ.get(CONTEXT_ENV) == "1" and not force:
        res.warnings.append(text)
        return
    raise StartupRuleError(
        "ValueError",
        f"{text} To allow overriding this maximum, set the env var {CONTEXT_ENV}=1",
        "_derive_context_length",
    )


def _memory_inputs(args: dict[str, Any], knobs: SimKnobs, draft: int, shape: ModelShape) -> MemoryInputs:
    return MemoryInputs(
        gpu_gib=knobs.gpu_memory_gib,
        tp_size=args["tp_size"],
        mem_fraction_static=args["mem_fraction_static"],
        context_len=args["context_length"],
        max_running_requests=args["max_running_requests"],
        max_total_tokens=args["max_total_tokens"],
        max_mamba_cache_size=args["max_mamba_cache_size"],
        mamba_full_memory_ratio=args["mamba_full_memory_ratio"],
        num_draft_tokens=draft,
        radix_cache=not args["disable_radix_cache"],
        extra_buffer=args["mamba_radix_cache_strategy"] in ("extra_buffer", "extra_buffer_lazy"),
        overlap=not args["disable_overlap_schedule"],
        ssm_dtype_bytes=2 if args["mamba_ssm_dtype"] in ("bfloat16", "float16") else 4,
        draft_weights_gib=shape.draft_weights_gib(args["tp_size"]) if draft else 0.0,
        draft_kv_layers=shape.mtp_layers if draft else 0,
    )


async def _build_pools(res: Resolution, shape: ModelShape, knobs: SimKnobs) -> Capacity:
    """Weights then pools, with SGLang's lines; a misfit dies like SGLang's scheduler does."""
    args = res.args
    draft = (args["speculative_num_draft_tokens"] or 0) if args["speculative_algorithm"] else 0
    inputs = _memory_inputs(args, knobs, draft, shape)
    free = inputs.gpu_gib - 0.6
    startup.logger.info(f"Load weight begin. avail mem={free:.2f} GB")
    await asyncio.sleep(knobs.start_delay * 0.4)
    startup.log_weights(shape, free, knobs.start_delay * 0.4)
    if inputs.draft_weights_gib:  # the MTP head is loaded as a second model (its own log pair)
        startup.log_draft_weights(shape, free - shape.weights_gib, inputs.draft_weights_gib)
    await asyncio.sleep(knobs.start_delay * 0.2)
    if knobs.fail_at_start == "oom":
        startup.die_in_scheduler(
            "RuntimeError",
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={args['mem_fraction_static']}",
            "__post_init__",
        )
    try:
        capacity = compute_capacity(inputs, shape)
    except (ValueError, RuntimeError) as exc:
        startup.die_in_scheduler(type(exc).__name__, str(exc), "_profile_available_bytes")
        raise  # not reached: the process is gone
    startup.log_pools(capacity, args, shape, draft)
    return capacity


async def _serve(res: Resolution, shape: ModelShape, knobs: SimKnobs, launch_command: str) -> None:
    started = time.monotonic()
    capacity = await _build_pools(res, shape, knobs)
    args = res.args
    is_spec = args["speculative_algorithm"] is not None
    scheduler = SimScheduler(
        max_running=capacity.max_running_requests,
        max_total_tokens=capacity.max_total_num_tokens,
        decode_tps=knobs.decode_tps,
        spec_draft_tokens=(args["speculative_num_draft_tokens"] or 0) if is_spec else 0,
        accept_length=knobs.accept_length,
        crash_after=knobs.crash_after,
        hybrid=shape.is_hybrid,
        mamba_cache_size=capacity.mamba_cache_size,
    )
    state = SimState(args, launch_command, shape, capacity, scheduler, knobs)
    runner = web.AppRunner(build_app(state), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, args["host"], args["port"], backlog=1024).start()
    startup.log_http_started(args["host"], args["port"])
    await asyncio.sleep(knobs.start_delay * 0.4)  # warmup: the port answers, /health says 503
    state.startup_time = time.monotonic() - started
    state.is_ready = True
    logger.info(startup.READY_LINE)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log_task = asyncio.create_task(scheduler.log_loop())
    await stop.wait()
    log_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await log_task
    await runner.cleanup()


def main(argv: list[str]) -> int:
    """`python -m fleetgen.sim ARGS`: returns the exit code (argparse exits 2 by itself on a bad flag)."""
    parser = build_parser()
    argv = merge_config(parser, argv)  # `--config FILE.yaml`, as prepare_server_args merges it
    namespace = parser.parse_args(argv)
    raw, knobs = _split(vars(namespace))
    startup.configure_logging(raw["log_level"])
    startup.logger.warning(startup.SIMULATION_NOTICE)
    shape = load_shape(raw["model_path"], knobs.architecture, knobs.weights_gib)
    try:
        res = resolve(raw, shape, knobs.gpu_memory_gib)
        _context_rule(res, shape, force=knobs.fail_at_start == "valueerror")
    except StartupRuleError as err:
        logging.shutdown()
        print(startup.launcher_traceback(err), file=sys.stderr, flush=True)
        return 1
    for warning in res.warnings:
        logger.warning(warning)
    logger.info(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in res.args.items())})")
    launch_command = " ".join(shlex.quote(a) for a in sglang_argv(argv))
    asyncio.run(_serve(res, shape, knobs, launch_command))
    return 0
