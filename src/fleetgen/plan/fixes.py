"""Ways out when an instance does not fit, ranked by cost, and the flags for a target concurrency (pure).

Every candidate is re-sized with the same engine arithmetic, so a fix is only offered when it really fits.
Cost: 0 a flag the rule demands, 1 a pool size, 2 lower state precision, 3 shorter context, 4 more GPUs
(the smallest tp that fits) or FP8 weights. Weights that alone fill the GPU leave only the cost-4 ways out.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace
from typing import Any

from fleetgen.plan.instance import can_quantize_fp8, size
from fleetgen.plan.types import GIB, Ask, Fix, Planner, Sizing

MAX_SCAN = 1024
MIN_TOKENS_PER_REQUEST = 4096  # a "concurrent request" must have room for at least this much context
TP_FACTORS = (2, 4, 8, 16)  # tp grows by these factors; the smallest that fits is offered


def _apply(ask: Ask, c: Fix) -> Ask:
    return replace(ask, args={**ask.args, **c.args}, env={**ask.env, **c.env}, tp=c.tp or ask.tp)


def _variants(planner: Planner, ask: Ask) -> list[Fix]:
    """The engine's own ways out, then the ones every engine has: half the context (above 4096 tokens), more
    GPUs (tp × 2, × 4, …: the first that fits is kept) and, for 16-bit weights not quantised yet, online FP8
    quantisation."""
    flag = planner.engine.context_flag
    ctx = int(ask.args.get(flag) or ask.shape.context_length)
    out = list(planner.variants(ask))
    if ctx > 4096:
        out.append(Fix(3, f"{flag} {ctx} → {ctx // 2}", {flag: ctx // 2}))
    out += [Fix(4, f"tp = {ask.tp * f}", tp=ask.tp * f) for f in TP_FACTORS]
    if can_quantize_fp8(ask) and "quantization" not in ask.args:
        fp8 = ask.shape.weight_bytes // 2 // ask.tp
        text = f"--quantization fp8 (weights {fp8 / GIB:.1f} GiB per GPU; check the quality)"
        out.append(Fix(4, text, {"quantization": "fp8"}))
    return out


def _is_usable(sized: Sizing, need: int = 1) -> bool:
    """Starts, runs `need` requests, and its KV pool holds each of them MIN_TOKENS (or its full context)."""
    m = sized.memory
    floor = max(need, 1) * min(m.context_length, MIN_TOKENS_PER_REQUEST)
    return sized.fits and m.max_running_requests >= need and m.kv_tokens >= floor


def _try(planner: Planner, ask: Ask, probe: Sizing, n: int) -> tuple[dict[str, Any], Sizing]:
    extra = planner.concurrency(ask, probe, n)
    return extra, size(planner, replace(ask, args={**ask.args, **extra}))


def _best(planner: Planner, ask: Ask) -> tuple[int, dict[str, Any], Sizing | None]:
    """The most running requests reachable by sizing the pools explicitly (usable is monotone in n)."""
    probe = size(planner, ask)
    most = bisect_left(
        range(1, MAX_SCAN + 1), True, key=lambda n: not _is_usable(_try(planner, ask, probe, n)[1], n)
    )
    if most == 0:
        return 0, {}, None
    extra, sized = _try(planner, ask, probe, most)
    return most, extra, sized


def _offered(required: Fix, variant: Fix, extra: dict[str, Any], n: int, sized: Sizing) -> Fix:
    """`required`, then `variant`, then the pool flags `extra`, as one fix offered: a text naming all three
    and what its sizing yields (`n` concurrent requests, its KV tokens)."""
    flags = " ".join(f"--{k} {v}" for k, v in extra.items())
    text = ", ".join(t for t in (required.change, variant.change, flags) if t)
    return replace(
        variant,
        cost=max(required.cost, variant.cost),
        change=f"{text} → {n} concurrent, {sized.memory.kv_tokens:,} KV tokens",
        args={**required.args, **variant.args, **extra},
        env={**required.env, **variant.env},
        tp=variant.tp or required.tp,
        max_running_requests=n,
        kv_tokens=sized.memory.kv_tokens,
    )


def ranked_fixes(planner: Planner, ask: Ask, base: Sizing) -> tuple[Fix, ...]:
    """Fixes that make this instance fit (or serve more), cheapest first, each with what it yields."""
    required = planner.required(ask, base)
    fixed = _apply(ask, required)
    fixes: list[Fix] = []
    alone = size(planner, fixed) if required.change else None
    if alone is not None and _is_usable(alone):
        fixes.append(_offered(required, Fix(0, ""), {}, alone.memory.max_running_requests, alone))
    has_tp = False
    for variant in _variants(planner, fixed):
        if variant.tp and has_tp:
            continue  # a smaller tp already fits
        n, extra, sized = _best(planner, _apply(fixed, variant))
        if sized is None or (base.fits and n <= base.memory.max_running_requests):
            continue
        has_tp = has_tp or bool(variant.tp)
        if any((f.max_running_requests, f.kv_tokens) == (n, sized.memory.kv_tokens) for f in fixes):
            continue  # a cheaper change already gives exactly this
        fixes.append(_offered(required, variant, extra, n, sized))
    return tuple(sorted(fixes, key=lambda f: (f.cost, -f.max_running_requests)))


def solve_target(planner: Planner, ask: Ask, base: Sizing, target: int) -> tuple[Fix | None, str]:
    """The cheapest flags giving `target` concurrent requests, or why none do (and the most reachable). The
    fix's args and env are the whole `engine.args` and `engine.env` to launch, not a change to them."""
    required = planner.required(ask, base)
    fixed = _apply(ask, required)
    best_n, best_text = 0, ""
    for variant in _variants(planner, fixed):
        trial = _apply(fixed, variant)
        extra, sized = _try(planner, trial, size(planner, trial), target)
        if _is_usable(sized, target):
            offer = _offered(required, variant, extra, sized.memory.max_running_requests, sized)
            return replace(offer, args={**ask.args, **offer.args}, env={**ask.env, **offer.env}), ""
        n, _, _ = _best(planner, trial)
        if n > best_n:
            best_n, best_text = n, variant.change or "the current flags"
    why = f"{target} concurrent requests do not fit in this GPU's memory with any ranked change; "
    return None, why + (f"at most {best_n} with {best_text}" if best_n else "not even one request fits")
