"""SGLang's `Planner`: its memory arithmetic (`memory`) with its startup rules (`rules`), headroom and context
warnings, its ways out, its concurrency flags and the host RAM its hierarchical cache pins (pure)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetgen.engines import get_engine
from fleetgen.engines.sglang import HICACHE_HOST_MEMORY, SGLangEngine, sglang_rules
from fleetgen.plan.sglang import throughput
from fleetgen.plan.sglang.headroom import largest_safe_fraction
from fleetgen.plan.sglang.memory import HICACHE_RESERVE_BYTES, SGLangExtras, draft_kv_in_cell, size_sglang
from fleetgen.plan.sglang.rules import check_sglang_flags
from fleetgen.plan.sglang.settings import SGLangSettings, sglang_ask
from fleetgen.plan.types import GIB, JOB_UNPLANNED, Ask, Fix, HostRam, Issue, Memory, Planner, Sizing


def rejections(ask: Ask) -> tuple[Issue, ...]:
    """SGLang's own refusals of these flags at start (`plan.sglang.rules`' errors): no memory arithmetic."""
    return check_sglang_flags(sglang_ask(ask)).errors


def size_instance(ask: Ask) -> Sizing:
    """SGLang's verdict: its memory arithmetic, its startup rules (`plan.sglang.rules`), headroom and context
    warnings."""
    x = sglang_ask(ask)
    s = x.settings
    memory, mem_errors = size_sglang(x)
    flags = check_sglang_flags(x)
    warnings = list(flags.warnings)
    headroom = []
    if memory.headroom_needed_bytes > memory.headroom_bytes:
        headroom.append(_headroom_error(memory, s.is_spec and not draft_kv_in_cell(s, x.rules)))
    if 0 < memory.kv_tokens < memory.context_length:
        warnings.append(_context_warning(memory))
    extras = SGLangExtras.of(memory)
    if ask.shape.is_hybrid and extras.mamba_ratio > 1 and memory.max_running_requests > 0:
        warnings.append(_states_warning(memory, extras))
    if s.is_hicache:
        pinned = _hicache_bytes(memory, s, ask.shape.is_hybrid and x.rules.hicache_hybrid)
        memory = replace(memory, extras=replace(extras, hicache_host_bytes=pinned))
    resolved = {
        "mem_fraction_static": extras.mem_fraction_static,
        "mamba_strategy": s.strategy,
        "overlap_schedule": s.is_overlap,
        "speculative_num_draft_tokens": s.draft_tokens,
        "mamba_ratio": s.mamba_ratio,
        "context_length": s.context_length,
        "ssm_dtype": s.ssm_dtype,
    }
    # a refused flag stops SGLang before it sizes anything: its memory errors would never be raised
    errors = flags.errors or tuple(mem_errors) or tuple(headroom)
    return Sizing(memory, errors, tuple(warnings), resolved)


def _context_warning(m: Memory) -> Issue:
    return Issue(
        "full-context",
        f"one request of full context ({m.context_length:,} tokens) does not fit: the KV pool holds "
        f"{m.kv_tokens:,} tokens per GPU",
        f"set context-length <= {m.kv_tokens:,} (e.g. 8192) if requests are shorter, or use tp = 2",
    )


def _states_warning(m: Memory, sg: SGLangExtras) -> Issue:
    """The radix cache holds ρ Mamba states per running request: what runs is a chat's sizing, and a batch
    job of distinct prompts runs many times more with it off (dropped where `plan --job` plans the job)."""
    return Issue(
        JOB_UNPLANNED,
        f"the radix cache holds {sg.mamba_ratio} Mamba states per running request: "
        f"{m.max_running_requests} run at once ({sg.mamba_slots} slots ÷ {sg.mamba_ratio}), sized for chat; "
        "a batch job runs many times more with it off",
        "`fleetgen plan --job JOB.toml --input PROMPTS` plans for the job; `fleetgen tune` measures it",
    )


def _headroom_error(m: Memory, with_draft: bool) -> Issue:
    """The static fraction leaves less outside the pools than the engine needs at the job's heaviest moment
    (`plan.sglang.headroom`): it would start, then die of CUDA OOM under load."""
    sg = SGLangExtras.of(m)
    draft = " and the MTP draft (weights + its own KV pool)" if with_draft else ""
    safe = largest_safe_fraction(m.free_bytes, m.headroom_needed_bytes)
    oom = '(an H100 at 0.95: "Tried to allocate 202.00 MiB … 1.38 MiB is free" in the GDN chunked prefill)'
    return Issue(
        "headroom",
        f"mem-fraction-static {sg.mem_fraction_static:.2f} leaves {m.headroom_bytes / GIB:.1f} GiB outside "
        f"the static pools; at the job's heaviest moment SGLang needs {m.headroom_needed_bytes / GIB:.1f} "
        f"GiB there ({sg.headroom}{draft}): it would die of CUDA OOM under load {oom}",
        f"set mem-fraction-static {safe:.2f} or lower (the largest safe here), or a smaller "
        "chunked-prefill-size / max-running-requests",
    )


def _hicache_bytes(m: Memory, s: SGLangSettings, is_hybrid: bool) -> int:
    """Pinned host RAM: a KV host pool and, for hybrid models, a Mamba host pool, both from ratio or size."""
    if s.hicache_size_gb > 0:
        return int(s.hicache_size_gb * 1e9) * (2 if is_hybrid else 1)
    mamba_host = SGLangExtras.of(m).mamba_slots * m.state_bytes_per_request if is_hybrid else 0
    return int(s.hicache_ratio * m.kv_pool_bytes) + int(s.hicache_ratio * mamba_host)


def variants(ask: Ask) -> list[Fix]:
    """SGLang's own ways out: pools sized explicitly, bfloat16 Mamba state."""
    if ask.shape.is_hybrid:
        return [Fix(1, ""), Fix(2, "--mamba-ssm-dtype bfloat16", {"mamba-ssm-dtype": "bfloat16"})]
    return [Fix(1, "")]


def concurrency(ask: Ask, sized: Sizing, n: int) -> dict[str, Any]:
    """max-running-requests, and for a hybrid model the Mamba slots that many requests need."""
    out: dict[str, Any] = {"max-running-requests": n}
    if ask.shape.is_hybrid:  # ρ Mamba slots per running request
        out["max-mamba-cache-size"] = SGLangExtras.of(sized.memory).mamba_ratio * n
    return out


def required(ask: Ask, base: Sizing) -> Fix:
    """The change SGLang's refusal of spec + no_buffer + radix cache names (0.5.10–0.5.13): extra_buffer, with
    SGLANG_ENABLE_SPEC_V2=1 where the release reads it off by default."""
    if any(e.rule == "spec-no-buffer-radix" for e in base.errors):
        r = sglang_rules(ask.rules)
        env = {r.spec_v2_env: "1"} if r.spec_v2_env and not r.spec_v2_default else {}
        text = f"--{r.strategy_flag} extra_buffer" + (f" + {r.spec_v2_env}=1" if env else "")
        return Fix(0, text, {r.strategy_flag: "extra_buffer"}, env)
    return Fix(0, "")


# SGLang's HiCacheController refuses host pools over the host's available RAM minus its reserve
HICACHE_FIX = "set hicache-size (GB per pool per instance) or a lower hicache-ratio"
HICACHE = HostRam(
    lambda m: SGLangExtras.of(m).hicache_host_bytes,
    HICACHE_RESERVE_BYTES,
    Issue("hicache-host-memory", HICACHE_HOST_MEMORY, HICACHE_FIX),
)
PLANNER = Planner(
    get_engine(SGLangEngine.name),
    size_instance,
    variants,
    concurrency,
    rejections,
    required,
    HICACHE,
    settings=lambda ask, job: throughput.settings(size_instance, ask, job),
    bound=throughput.bound_of,
)
