"""SGLang's settings for a job's throughput, in its own flags for the release planned (pure).

What caps a hybrid model's running requests is the Mamba pool, not memory: `max running = min(…, slots // ρ)`,
ρ = 5 with the radix cache + extra_buffer + overlap (0.5.14+'s `auto`), 3 for no_buffer, 1 with
`--disable-radix-cache`, where `--max-running-requests M` sizes the pool at exactly M slots. A job of distinct
prompts gets nothing from the radix cache, so the settings offered here turn it off and size the pool for the
job: the largest M whose state and the job's KV per request fit the static budget. On the H200 (0.5.15,
Qwen3.6-27B, outputs ~1,800 tokens) that took 44 running to 256 and the decode rate from 1,460 to 3,008 tok/s;
the replayed SSM decode (`--enable-linear-replayssm`, 0.5.15+, no_buffer only) to 3,660
(bench/results/grid-sglang-0.5.15-h200.md).

The settings offered: radix cache off with the Mamba pool sized for the job's KV per request (and ¾ of it),
the context sized to the job, decode graphs covering the batch, the replayed SSM decode (0.5.15+), spec the
other way, bf16 state / FP8 KV marked as changing the numbers.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fleetgen.engines.sglang import sglang_rules
from fleetgen.plan.job import JobShape
from fleetgen.plan.sglang.admission import FAR_FEWER, Admission, admitted, spec_over_allocation
from fleetgen.plan.sglang.memory import SGLangExtras, gpu_tier
from fleetgen.plan.sglang.settings import SKIP_DECODE_LOCK_ENV, SGLangSettings, sglang_ask
from fleetgen.plan.throughput import used_share
from fleetgen.plan.types import MIB, Ask, Setting, Sizing

MAX_RUNNING = 4096  # SGLang's own ceiling on its estimate; no search goes past it
SPEC_FLAGS = ("speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk")
MTP_FLAGS = {
    "speculative-algorithm": "EAGLE",
    "speculative-num-steps": 3,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 4,
}
HICACHE_FLAGS = ("enable-hierarchical-cache", "hicache-ratio", "hicache-size")
REPLAYSSM_SPEC = "enable-linear-replayssm-spec"
# 0.5.17+ on a multimodal model: the tokenizer's CUDA-IPC feature pool (1,024 MiB) and its CUDA context come
# back to the pools with CPU transport of the features ("Pass --mm-feature-transport=cpu to opt out", its log)
MM_TRANSPORT = "mm-feature-transport"
REPLAYSSM = "enable-linear-replayssm"
# 0.5.16–0.5.17 capture the prefill CUDA graph only where 4 GiB is left after the pools, so a lower static
# fraction crosses the gate: on an H100 with the replayed SSM decode 0.91 left 5.14 GiB, captured it and died
# ("CUDA error: out of memory" in capture_end) where 0.93 left 3.39, skipped it and ran 2,191 tok/s, the best
# measured (tests/data/real-engines/sglang-0.5.17-h100-mmcpu-tune/). The replayed settings say so: no graph.
PREFILL_GRAPH_OFF = "disable-prefill-cuda-graph"
# what each option that changes the numbers changes (offered, taken only when the user allows it)
NUMERICS = {
    "mamba-ssm-dtype": "the GDN recurrent state is kept in bfloat16 instead of float32 (rounding every step)",
    "kv-cache-dtype": "the KV cache is stored in FP8 (attention reads rounded keys and values)",
}

Size = Callable[[Ask], Sizing]


def prefix_cache_pays(job: JobShape) -> bool:
    """Whether the radix cache saves this job much: the prefix its prompts share (system prompt, history) is
    a quarter or more of what a request holds. A chat template's shared framing on short prompts (the share of
    a 14-token prompt was 0.57) saves a few tokens of prefill against thousands decoded: it does not pay."""
    return job.shared_prefix_tokens >= 0.25 * job.kv_tokens_per_request


def job_context(job: JobShape, model_context: int) -> int:
    """The context the job needs, rounded up to 256 tokens, never above the model's own."""
    return min(-(-job.context_tokens // 256) * 256, model_context)


def _graph_flag(ask: Ask) -> str:
    """The decode CUDA-graph batch flag under the release's name (split from cuda-graph-max-bs in 0.5.14)."""
    old = {r.old for r in ask.rules.renames}
    return "cuda-graph-max-bs" if "cuda-graph-max-bs-decode" in old else "cuda-graph-max-bs-decode"


def graph_limit(ask: Ask, args: Mapping[str, Any]) -> tuple[int, str]:
    """The largest decode batch SGLang captures a CUDA graph for, and whose figure it is: the flag given, else
    its default by GPU memory (`_handle_gpu_memory_settings`, server_args.py, the same in 0.5.15 and 0.5.17:
    256 on 60–160 GiB at tp < 4, 512 from 160 GiB). A batch past it decodes without graphs (eager)."""
    given = _settings(ask, args).cuda_graph_max_bs
    if given:
        return given, f"--{_graph_flag(ask)} {given}"
    _, tier_bs = gpu_tier(ask.total_bytes / MIB, ask.tp, sglang_rules(ask.rules))
    return tier_bs, f"SGLang's default {_graph_flag(ask)} {tier_bs} on this GPU"


def _settings(ask: Ask, args: Mapping[str, Any]) -> SGLangSettings:
    x = sglang_ask(replace(ask, args=args))
    return x.settings


def admission_of(ask: Ask, sized: Sizing, job: JobShape) -> Admission:
    """What SGLang's scheduler admits of the job on this sizing's KV pool (`plan.sglang.admission`)."""
    s = _settings(ask, ask.args)
    spec = spec_over_allocation(s.draft_tokens) if s.is_spec else 0
    return admitted(sized.memory.kv_tokens, job, spec_tokens=spec, page_size=s.page_size)


def bound_of(ask: Ask, sized: Sizing, job: JobShape) -> tuple[int, str]:
    """The job's running requests on this sizing and what bounds them, in SGLang's terms. Its KV bound counts
    each request at its end (`kv_tokens_per_request`), not part-way through as vLLM's does: SGLang admits a
    request only while room is left for a share of the running requests' remaining outputs (its
    `new_token_ratio`, decaying from 0.7) and retracts when the pool runs out; at its end matched the engine
    where the KV pool bound (H200, the MTP candidate: 66 planned, within 5 % of the most it ran). Where the
    pool is tight, SGLang's admission binds below it (`admission_of`: a new request needs its prompt and
    4,096 clipped output tokens free)."""
    m, s = sized.memory, _settings(ask, ask.args)
    extras = SGLangExtras.of(m)
    by_kv = int(m.kv_tokens // max(job.kv_tokens_per_request, 1.0))
    terms = [(by_kv, f"the KV pool's {m.kv_tokens:,} tokens ÷ {job.kv_tokens_per_request:,.0f} per request")]
    admission = admission_of(ask, sized, job)
    terms.append((admission.running, admission.text()))
    if ask.shape.is_hybrid:
        text = f"the Mamba pool's {extras.mamba_slots} slots ÷ ρ {extras.mamba_ratio} per request"
        terms.append((extras.mamba_slots // max(extras.mamba_ratio, 1), text))
    if s.max_running_requests is not None:
        terms.append((s.max_running_requests, f"max-running-requests {s.max_running_requests}"))
    terms.append((m.max_running_requests, "SGLang's own cap (its estimate from context-length, tokens ÷ 2)"))
    running, bound = min(terms, key=lambda t: t[0])
    limit, whose = graph_limit(ask, ask.args)
    if running > limit:
        bound += f"; decode past {limit} running runs without CUDA graphs (eager: {whose})"
    return running, bound


def _pool_args(ask: Ask, base: Mapping[str, Any], n: int, *, graphs: bool = True) -> dict[str, Any]:
    """`base` with the radix cache off and the pools sized for `n` running requests (one Mamba slot each),
    the decode CUDA graphs raised to cover them (`graphs`; else left where they are: past them, eager)."""
    rules = sglang_rules(ask.rules)
    args = {k: v for k, v in base.items() if k not in HICACHE_FLAGS}  # it needs the radix cache
    args |= {"disable-radix-cache": True, "max-running-requests": n}
    if ask.shape.is_hybrid:
        args[rules.strategy_flag] = "no_buffer"
    limit, _ = graph_limit(ask, base)
    if graphs and n > limit:
        args[_graph_flag(ask)] = n
    return args


def most_running(
    size: Size, ask: Ask, base: Mapping[str, Any], job: JobShape, ctx: int, *, admits: bool = True
) -> int:
    """The most running requests whose state and the job's KV per request fit, and (`admits`) that SGLang's
    scheduler admits on the pool that leaves (each is monotone in n)."""

    def fits_as(n: int, graphs: bool) -> bool:
        trial = replace(ask, args=_pool_args(ask, base, n, graphs=graphs))
        sized = size(trial)
        m = sized.memory
        enough_kv = m.kv_tokens >= max(n * job.kv_tokens_per_request, ctx)
        if not (sized.fits and m.max_running_requests >= n and enough_kv):
            return False
        return not admits or admission_of(trial, sized, job).running >= n

    def fits(n: int) -> bool:  # the graphs raised to cover n, or (their memory refused) left eager past
        return fits_as(n, True) or fits_as(n, False)

    return bisect_left(range(1, MAX_RUNNING + 1), True, key=lambda n: not fits(n))


def _graph_pools(size: Size, ask: Ask, base: Mapping[str, Any], k: int) -> list[tuple[str, dict[str, Any]]]:
    """The pools for `k` running requests as offered, each with its name's tail: the decode graphs raised to
    cover `k` where the headroom model holds their memory (~2 MiB a batch size), and the engine's own graph
    limit beside it (decode past it eager), so tune measures across it; the limit alone where raising does
    not fit. On the H200 `noradix-288-mf92-replay` decoded slower than 256 (3,024 vs 3,660 tok/s) with
    the graphs stopping at 256: whether graphs past the default pay is measured, not assumed."""
    limit, _ = graph_limit(ask, base)
    raised = _pool_args(ask, base, k)
    if k <= limit:
        return [("", raised)]
    eager = ("", _pool_args(ask, base, k, graphs=False))
    if not size(replace(ask, args=raised)).fits:
        return [eager]
    return [("", raised), (f"-graphs{limit}", eager[1])]


def _offer(
    size: Size, ask: Ask, job: JobShape, name: str, change: str, args: dict[str, Any], **kw: Any
) -> Setting:
    trial = replace(ask, args=args, env=kw.pop("env", ask.env))
    sized = size(trial)
    running, bound = bound_of(trial, sized, job)
    return Setting(
        name,
        change,
        args,
        dict(trial.env),
        running if sized.fits else 0,
        bound if sized.fits else "; ".join(e.message for e in sized.errors),
        sized.memory.kv_tokens,
        is_spec=_settings(trial, args).is_spec,
        used_share=used_share(sized.memory, running, job),
        **kw,
    )


def _spec_toggled(ask: Ask, base: Mapping[str, Any], is_spec: bool) -> tuple[dict[str, Any], str] | None:
    """The user's flags with speculative decoding the other way: off, or the model's MTP head (3/1/4)."""
    if is_spec:
        return {k: v for k, v in base.items() if not k.startswith("speculative-")}, "no speculative decoding"
    if ask.shape.mtp_layers:
        return {**base, **MTP_FLAGS}, "MTP speculative decoding (EAGLE 3/1/4)"
    return None


def settings(size: Size, ask: Ask, job: JobShape) -> list[Setting]:
    """SGLang's throughput settings for this job, best planned first: the radix cache off and the pools sized
    for the job (and 3/4 of that, for `tune` to narrow in), with the replayed SSM decode where the release has
    it, speculative decoding the other way, and the options that change the numbers (marked)."""
    s = _settings(ask, ask.args)
    env_candidates = _skip_decode_lock(size, ask, job)
    if not ask.shape.is_hybrid or prefix_cache_pays(job):
        return (
            env_candidates  # a prefix cache that pays, or no Mamba pool to free: the engine's sizing stands
        )
    ctx = job_context(job, ask.shape.context_length)
    base = {**ask.args, "context-length": ctx}
    if s.mm_ipc_pool_mb:  # a batch job's prompts are text: its features' GPU pool is memory the KV pool lacks
        base[MM_TRANSPORT] = "cpu"
    rules = sglang_rules(ask.rules)
    out: list[Setting] = list(env_candidates)
    variants: list[tuple[str, str, dict[str, Any]]] = [("", "", base)]
    toggled = _spec_toggled(ask, base, s.is_spec)
    if toggled:
        variants.append(("-nospec" if s.is_spec else "-mtp", toggled[1], toggled[0]))
    if rules.has_linear_replayssm_spec:  # the spec verify's fold window in place of its SSM snapshots
        variants += [
            (
                f"-replayssm-spec{suffix}",
                ", ".join(filter(None, [what, "--enable-linear-replayssm-spec"])),
                spec,
            )
            for suffix, what, args in list(variants)
            if _settings(ask, args).is_spec and not args.get(REPLAYSSM_SPEC)
            for spec in [{**args, REPLAYSSM_SPEC: True}]
        ]
    for suffix, what, args in variants:
        n = most_running(size, ask, args, job, ctx)
        held = _held_back(size, ask, job, (suffix, args), ctx, n)
        if held is not None:
            out.append(held)
        if held is not None or n == 0:
            continue
        for k in [k for k in dict.fromkeys((n, n * 3 // 4)) if k > 0]:  # ¾ of 1 is none
            for graphs, pool in _graph_pools(size, ask, args, k):
                text = ", ".join(filter(None, [what, _change_text(ask, pool, k, ctx)]))
                # the replayed SSM decode first where the release has it: on the H200 it decoded 1.22x the
                # plain no_buffer decode at 256 running (bench/results/grid-sglang-0.5.15-h200.md); tune
                # measures both
                if rules.has_linear_replayssm and not _settings(ask, pool).is_spec:
                    replay, added = _replayed(ask, pool)
                    name = f"no-radix-{k}{graphs}-replayssm{suffix}"
                    out.append(_offer(size, ask, job, name, text + added, replay))
                out.append(_offer(size, ask, job, f"no-radix-{k}{graphs}{suffix}", text, pool))
    for suffix, what, args in variants:  # the static fraction, searched where speculation is off
        if _settings(ask, args).is_spec:
            continue
        for is_replay in (False, True) if rules.has_linear_replayssm else (False,):
            out += _fractions(size, ask, job, (suffix, what, args), ctx, is_replay)
    out += _numerics(size, ask, job, base, ctx)
    return out


def _replayed(ask: Ask, args: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """`args` with the replayed SSM decode, and what it adds as typed (the prefill CUDA graph off where the
    release gates it on the memory the pools leave: `PREFILL_GRAPH_OFF`)."""
    if not sglang_rules(ask.rules).auto_prefill_graph_gate or args.get(PREFILL_GRAPH_OFF):
        return {**args, REPLAYSSM: True}, f" + --{REPLAYSSM}"
    return {**args, REPLAYSSM: True, PREFILL_GRAPH_OFF: True}, f" + --{REPLAYSSM} --{PREFILL_GRAPH_OFF}"


def _skip_decode_lock(size: Size, ask: Ask, job: JobShape) -> list[Setting]:
    """The user's flags with `SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1` (0.5.17+), an engine env candidate: with
    the radix cache and extra_buffer a decoding request leaves its matched prefix's Mamba slot evictable, one
    slot fewer per running request (ρ 5 → 4: kv_cache_configurator.py `_calculate_mamba_ratio`); upstream
    reports +20 % output tok/s at concurrency 200. Nothing to offer without the radix cache (no lock)."""
    s = _settings(ask, ask.args)
    rules = sglang_rules(ask.rules)
    if not (rules.has_skip_decode_lock and s.is_radix and s.strategy.startswith("extra_buffer")):
        return []
    if s.is_skip_decode_lock or not ask.shape.is_hybrid or not size(ask).fits:
        return []
    change = (
        f"engine env {SKIP_DECODE_LOCK_ENV}=1 (an engine env candidate, not a flag: the radix cache leaves "
        "a decoding request's matched Mamba prefix evictable)"
    )
    env = {**ask.env, SKIP_DECODE_LOCK_ENV: "1"}
    return [_offer(size, ask, job, "as-written-skip-decode-lock", change, dict(ask.args), env=env)]


def _held_back(
    size: Size, ask: Ask, job: JobShape, variant: tuple[str, Mapping[str, Any]], ctx: int, n: int
) -> Setting | None:
    """The variant withheld where SGLang's admission runs far fewer than its pools hold (`FAR_FEWER`): a
    setting of 0 running whose bound says why in SGLang's terms (tune measures none of 0); None to offer it.
    The pools alone size `pooled`; the admission, `n` (0: nothing fits, nothing to say)."""
    suffix, args = variant
    pooled = most_running(size, ask, args, job, ctx, admits=False)
    if pooled == 0 or n >= FAR_FEWER * pooled:
        return None
    pool = _pool_args(ask, args, pooled)
    trial = replace(ask, args=pool)
    admission = admission_of(trial, size(trial), job)
    why = (
        f"withheld: {admission.text()}, far fewer than the {pooled} its pools hold; give the KV pool more "
        "(a higher mem-fraction-static, no speculation) or shorter max_tokens"
    )
    name = f"no-radix-{pooled}{suffix}"
    return Setting(
        name, "", pool, dict(ask.env), 0, why, admission.pool_tokens, is_spec=_settings(trial, pool).is_spec
    )


def _fractions(
    size: Size, ask: Ask, job: JobShape, variant: tuple[str, str, Mapping[str, Any]], ctx: int, replay: bool
) -> list[Setting]:
    """The pools sized at a higher static fraction: where the most of the job's requests run (each fraction
    up to 0.99 in hundredths, sized by `most_running`, which refuses what would leave less outside the pools
    than the job's heaviest moment needs: `plan.sglang.headroom`), and two hundredths below it, a step
    safer. On the H100 the fraction was the lever: 0.85 → 0.92 ran 58 → 79 (+19 % decode tok/s)."""
    suffix, what, base = variant
    args, added = _replayed(ask, base) if replay else (dict(base), "")
    start = SGLangExtras.of(size(replace(ask, args=args)).memory).mem_fraction_static
    steps = range(round(start * 100) + 1, 100)
    found = {
        f / 100: most_running(size, ask, {**args, "mem-fraction-static": f / 100}, job, ctx) for f in steps
    }
    if not found or max(found.values()) == 0:
        return []
    best = max(found, key=lambda f: (found[f], -f))
    out = []
    for f in dict.fromkeys([best, round(best - 0.02, 2)]):
        n = found.get(f, 0)
        if n == 0 or n <= most_running(size, ask, args, job, ctx):
            continue
        _, pool = _graph_pools(size, ask, {**args, "mem-fraction-static": f}, n)[0]
        text = ", ".join(
            filter(None, [what, f"{_change_text(ask, pool, n, ctx)} --mem-fraction-static {f:.2f}"])
        )
        text += added
        name = f"no-radix-{n}-mf{round(f * 100)}" + ("-replayssm" if replay else "") + suffix
        out.append(_offer(size, ask, job, name, text, pool))
    return out


def _numerics(size: Size, ask: Ask, job: JobShape, base: Mapping[str, Any], ctx: int) -> list[Setting]:
    """The pools sized again with the state or the KV cache in fewer bytes (each changes the numbers)."""
    out = []
    for flag, value in (("mamba-ssm-dtype", "bfloat16"), ("kv-cache-dtype", "fp8_e4m3")):
        if flag in base:
            continue
        args = {**base, flag: value}
        n = most_running(size, ask, args, job, ctx)
        if n:
            _, pool = _graph_pools(size, ask, args, n)[0]
            text = f"{_change_text(ask, pool, n, ctx)}, --{flag} {value}"
            name = f"no-radix-{n}-{value}"
            out.append(_offer(size, ask, job, name, text, pool, numerics=NUMERICS[flag]))
    return out


def _change_text(ask: Ask, pool: Mapping[str, Any], n: int, ctx: int) -> str:
    """The flags a setting adds to the user's, as they would be typed."""
    parts = ["--disable-radix-cache", f"--max-running-requests {n}", f"--context-length {ctx}"]
    rules = sglang_rules(ask.rules)
    if rules.strategy_flag in pool:
        parts.append(f"--{rules.strategy_flag} no_buffer")
    graph = _graph_flag(ask)
    if graph in pool:
        parts.append(f"--{graph} {pool[graph]}")
    if MM_TRANSPORT in pool and MM_TRANSPORT not in ask.args:
        parts.append(f"--{MM_TRANSPORT} {pool[MM_TRANSPORT]}")
    text = " ".join(parts)
    if any(k in ask.args for k in HICACHE_FLAGS):
        text += ", no hierarchical cache (it needs the radix cache)"
    return text
