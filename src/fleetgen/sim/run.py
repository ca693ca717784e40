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
from fleetgen.sim.faults import FaultMode
from fleetgen.sim.flags import SIM_KNOBS, build_parser
from fleetgen.sim.memory import Capacity, MemoryInputs, compute_capacity
from fleetgen.sim.model import ModelShape, load_shape
from fleetgen.sim.resolve import Resolution, StartupRuleError, resolve
from fleetgen.sim.server import build_app
from fleetgen.sim.state import SimKnobs, SimState
from fleetgen.sim.stepmodel import FixedPace, Pace, forced_accept_length, roofline_for
from fleetgen.sim.tokens import SimTokens

logger = logging.getLogger("sglang.srt.entrypoints.engine")
SPEC_DESTS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
ACC_LEN_ENV = "SGLANG_SIMULATE_ACC_LEN"  # SGLang's forced acceptance (`environ.py`; off when <= 0)
BARE_KNOBS = frozenset(flag for flag, kwargs in SIM_KNOBS if kwargs.get("action") == "store_true")  # no value


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
            skip_value = "=" not in arg and arg not in BARE_KNOBS
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


def _ssm_dtype_bytes(args: dict[str, Any]) -> int:
    return 2 if args["mamba_ssm_dtype"] in ("bfloat16", "float16") else 4


def num_draft_tokens(args: dict[str, Any]) -> int:
    """Tokens verified per request per step: 0 without speculative decoding."""
    return (args["speculative_num_draft_tokens"] or 0) if args["speculative_algorithm"] else 0


def memory_inputs(args: dict[str, Any], knobs: SimKnobs, shape: ModelShape) -> MemoryInputs:
    """What the pool arithmetic reads, from the resolved args."""
    draft = num_draft_tokens(args)
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
        lazy_extra_buffer=args["mamba_radix_cache_strategy"] == "extra_buffer_lazy",
        ssm_dtype_bytes=_ssm_dtype_bytes(args),
        draft_weights_gib=shape.draft_weights_gib(args["tp_size"]) if draft else 0.0,
        draft_kv_layers=shape.mtp_layers if draft else 0,
    )


async def _build_pools(res: Resolution, shape: ModelShape, knobs: SimKnobs) -> Capacity:
    """Weights then pools, with SGLang's lines; a misfit dies like SGLang's scheduler does."""
    args = res.args
    inputs = memory_inputs(args, knobs, shape)
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
    startup.log_pools(capacity, args, shape, num_draft_tokens(args))
    return capacity


def build_scheduler(
    args: dict[str, Any], knobs: SimKnobs, shape: ModelShape, capacity: Capacity, acc_len_env: str | None
) -> SimScheduler:
    """The scheduler for the pools built: capped at the max running requests the arithmetic gives, paced
    by the roofline with `--sim-bandwidth-gbs`, else by the fixed `--sim-decode-tps`."""
    draft = num_draft_tokens(args)
    pace: Pace = FixedPace(knobs.decode_tps)
    if knobs.bandwidth_gbs > 0:
        pace = roofline_for(
            shape,
            bandwidth_gbs=knobs.bandwidth_gbs,
            tp_size=args["tp_size"],
            ssm_dtype_bytes=_ssm_dtype_bytes(args),
            num_spec_steps=(args["speculative_num_steps"] or 0) if draft else 0,
            num_draft_tokens=draft,
        )
    return SimScheduler(
        max_running=capacity.max_running_requests,
        max_total_tokens=capacity.max_total_num_tokens,
        pace=pace,
        time_scale=knobs.time_scale,
        max_prefill_tokens=args["max_prefill_tokens"],
        spec_draft_tokens=draft,
        accept_length=forced_accept_length(acc_len_env, knobs.accept_length, draft),
        crash_after=knobs.crash_after,
        hybrid=shape.is_hybrid,
        mamba_cache_size=capacity.mamba_cache_size,
    )


async def _serve(res: Resolution, shape: ModelShape, knobs: SimKnobs, launch_command: str) -> None:
    started = time.monotonic()
    capacity = await _build_pools(res, shape, knobs)
    args = res.args
    scheduler = build_scheduler(args, knobs, shape, capacity, os.environ.get(ACC_LEN_ENV))
    state = SimState(args, launch_command, shape, capacity, scheduler, knobs)
    state.tokens = SimTokens.load(args["tokenizer_path"])
    state.fault.set(FaultMode(knobs.fault))
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
    tasks = [asyncio.create_task(scheduler.log_loop()), asyncio.create_task(scheduler.run())]
    await stop.wait()
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await runner.cleanup()


def configure(values: dict[str, Any]) -> tuple[Resolution, ModelShape, SimKnobs]:
    """Parsed flags (argparse dests) resolved for the model's shape, and the `--sim-*` knobs; raises
    StartupRuleError as SGLang's resolution does."""
    raw, knobs = _split(values)
    shape = load_shape(raw["model_path"], knobs.architecture, knobs.weights_gib)
    res = resolve(raw, shape, knobs.gpu_memory_gib)
    _context_rule(res, shape, force=knobs.fail_at_start == "valueerror")
    return res, shape, knobs


def main(argv: list[str]) -> int:
    """`python -m fleetgen.sim ARGS`: returns the exit code (argparse exits 2 by itself on a bad flag)."""
    parser = build_parser()
    argv = merge_config(parser, argv)  # `--config FILE.yaml`, as prepare_server_args merges it
    values = vars(parser.parse_args(argv))
    startup.configure_logging(values["log_level"])
    startup.logger.warning(startup.SIMULATION_NOTICE)
    try:
        res, shape, knobs = configure(values)
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
