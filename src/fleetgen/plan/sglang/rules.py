"""SGLang's startup checks, derived before launch and quoted in the engine's own words (pure).

Each rule is a function of the resolved settings; they are listed in `SGLANG_RULES` (a registry, not a chain
of branches) and return the `Issue`s they find: errors the engine would raise, warnings it would log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetgen.engines.sglang import (
    EXTRA_BUFFER_NO_RADIX,
    HICACHE_NO_RADIX,
    HICACHE_NO_RADIX_FIX,
    NO_BUFFER_OVERLAP,
    NO_BUFFER_PAGE,
    NO_BUFFER_PAGE_FIX,
    SPEC_NO_BUFFER_RADIX,
    SPEC_RADIX_DISABLED,
    SPEC_V2_REMOVED,
    TRACK_INTERVAL,
    extra_buffer_fix,
    extra_buffer_no_radix_fix,
    no_buffer_overlap_fix,
)
from fleetgen.plan.sglang.settings import SGLangAsk
from fleetgen.plan.types import Issue


@dataclass(frozen=True)
class Found:
    errors: tuple[Issue, ...] = ()
    warnings: tuple[Issue, ...] = ()


def _error(rule: str, text: str, fix: str) -> Found:
    return Found(errors=(Issue(rule, text, fix),))


def _warning(rule: str, text: str, fix: str) -> Found:
    return Found(warnings=(Issue(rule, text, fix),))


Rule = Callable[[SGLangAsk], Found]


def spec_no_buffer_radix(x: SGLangAsk) -> Found:
    """Spec + no_buffer + radix cache: unchecked (≤0.5.8), radix silently off (0.5.9), refused (0.5.10–13)."""
    s, r = x.settings, x.rules
    arch = x.shape.architecture
    if s.radix_dropped_for_spec:
        text = SPEC_RADIX_DISABLED.format(arch=arch) + " (a warning: the server starts without prefix reuse)"
        return _warning("spec-no-buffer-radix", text, extra_buffer_fix(r))
    if not (x.shape.is_hybrid and s.is_spec and s.is_radix and s.strategy == "no_buffer"):
        return Found()
    if r.spec_no_buffer_radix == "raises":
        return _error("spec-no-buffer-radix", SPEC_NO_BUFFER_RADIX.format(arch=arch), extra_buffer_fix(r))
    if r.spec_no_buffer_radix == "unchecked":
        text = (
            f"{r.name} does not check speculative decoding with radix cache under no_buffer for {arch}: "
            "it starts with both (0.5.9 turns radix cache off, 0.5.10–0.5.13 refuse the combination)"
        )
        return _warning("spec-no-buffer-radix", text, extra_buffer_fix(r))
    return Found()


def extra_buffer_without_radix(x: SGLangAsk) -> Found:
    s = x.settings
    if not (x.shape.is_hybrid and s.strategy_given.startswith("extra_buffer") and not s.is_radix):
        return Found()
    fix = extra_buffer_no_radix_fix(x.rules)
    if x.rules.rejects_extra_buffer_without_radix:
        return _error("extra-buffer-no-radix", EXTRA_BUFFER_NO_RADIX, fix)
    return _warning("extra-buffer-no-radix", "extra_buffer has no effect with disable-radix-cache", fix)


def hicache_without_radix(x: SGLangAsk) -> Found:
    if x.settings.is_hicache and not x.settings.is_radix:
        return _error("hicache-no-radix", HICACHE_NO_RADIX, HICACHE_NO_RADIX_FIX)
    return Found()


def track_interval(x: SGLangAsk) -> Found:
    s = x.settings
    if (
        x.shape.is_hybrid
        and s.strategy.startswith("extra_buffer")
        and s.is_spec
        and s.track_interval < s.draft_tokens
    ):
        text = TRACK_INTERVAL.format(x=s.track_interval, y=s.draft_tokens)
        if not x.rules.track_interval_text:  # 0.5.14+: `assert a >= b` without a message
            text = f"AssertionError (no message; {x.rules.name} asserts it): {text}"
        return _error("track-interval", text, f"set mamba-track-interval >= {s.draft_tokens}")
    return Found()


def no_buffer_limits(x: SGLangAsk) -> Found:
    s = x.settings
    if not (x.shape.is_hybrid and s.is_radix and s.strategy == "no_buffer"):
        return Found()
    errors: list[Issue] = []
    if s.page_size != 1 and x.rules.explicit_no_buffer_needs_no_overlap:
        errors.append(Issue("no-buffer-page-size", NO_BUFFER_PAGE, NO_BUFFER_PAGE_FIX))
    if s.is_overlap and s.strategy_given == "no_buffer":
        errors.append(Issue("no-buffer-overlap", NO_BUFFER_OVERLAP, no_buffer_overlap_fix(x.rules)))
    return Found(errors=tuple(errors))


# 0.5.17 server_args.py `_handle_linear_replayssm` (the spec-verify fold's checks), in its words
REPLAYSSM_SPEC_TOPK = (
    "--enable-linear-replayssm-spec requires a linear draft chain (--speculative-eagle-topk in {{None, 1}}); "
    "the chunked verify kernel uses a strictly-lower causal mask and is invalid for EAGLE tree verify. Got "
    "--speculative-eagle-topk={topk!r}."
)
REPLAYSSM_SPEC_AND_DECODE = (
    "--enable-linear-replayssm-spec and --enable-linear-replayssm are mutually exclusive: they share the "
    "ring storage but drive it with incompatible cursor protocols (per-decode-forward vs per-verify-commit "
    "advance)."
)


def linear_replayssm_spec(x: SGLangAsk) -> Found:
    """--enable-linear-replayssm-spec (0.5.17+): a linear draft chain only, never with the decode replay."""
    args = x.translation.args
    if not (args.get("enable-linear-replayssm-spec") and x.rules.has_linear_replayssm_spec):
        return Found()
    topk = args.get("speculative-eagle-topk")
    if topk not in (None, 1):
        return _error(
            "replayssm-spec-topk", REPLAYSSM_SPEC_TOPK.format(topk=topk), "set speculative-eagle-topk 1"
        )
    if args.get("enable-linear-replayssm"):
        fix = (
            "keep one: enable-linear-replayssm-spec for speculative decoding, enable-linear-replayssm without"
        )
        return _error("replayssm-spec-and-decode", REPLAYSSM_SPEC_AND_DECODE, fix)
    return Found()


def mem_fraction_range(x: SGLangAsk) -> Found:
    mfs = x.settings.mem_fraction_static
    if mfs is not None and not 0 < mfs < 1:
        fix = "use a fraction such as 0.85, or leave it out for SGLang's default"
        return _error("mem-fraction-static", f"--mem-fraction-static {mfs} is outside (0, 1)", fix)
    return Found()


def renamed_flags(x: SGLangAsk) -> Found:
    names = {r.old: r for r in x.rules.renames}
    warnings = []
    for old, new in x.translation.renamed:
        rename = names[old]
        alts = " or ".join(f"--{n}" for n in rename.new)
        verdict = "is deprecated in" if rename.still_accepted else "is not accepted by"
        text = f"--{old} {verdict} {x.rules.name} ({rename.note}): fleetgen launches --{new} instead"
        warnings.append(Issue("renamed-flag", text, f"write {alts} in engine.args"))
    warnings += [
        Issue("deprecated-flag", f"--{k} is deprecated in {x.rules.name}: {why}", why)
        for k, why in x.rules.deprecated_flags.items()
        if k in x.args
    ]
    errors = [
        Issue("removed-flag", f"--{k} is not accepted by {x.rules.name}: {why}", why)
        for k, why in x.rules.removed_flags.items()
        if k in x.args
    ]
    return Found(errors=tuple(errors), warnings=tuple(warnings))


def architecture(x: SGLangAsk) -> Found:
    """A model architecture the release has no model class for (Qwen3.5/3.6 before 0.5.9)."""
    if x.shape.architecture not in x.rules.missing_archs:
        return Found()
    text = f"{x.rules.name} has no model for {x.shape.architecture} (sglang/srt/models/ lacks it)"
    return _error("architecture", text, "use a newer SGLang (0.5.9 or later for Qwen3.5/3.6)")


def hicache_hybrid(x: SGLangAsk) -> Found:
    """Before 0.5.10 the hierarchical cache of a hybrid model is the plain HiRadixCache: no Mamba state."""
    if not (x.settings.is_hicache and x.shape.is_hybrid and not x.rules.hicache_hybrid):
        return Found()
    text = (
        f"{x.rules.name} uses the plain HiRadixCache for hybrid models: Mamba state is neither kept on the "
        "host nor restored (HiMambaRadixCache arrives in 0.5.10); plan counts only the KV host pool"
    )
    return _warning("hicache-hybrid", text, "use SGLang 0.5.10 or later for HiCache here")


def spec_overlap(x: SGLangAsk) -> Found:
    s, r = x.settings, x.rules
    if not s.is_spec:
        return Found()
    if not r.spec_v2_env and "SGLANG_ENABLE_SPEC_V2" in x.env:
        text = SPEC_V2_REMOVED  # the release's own warning; from 0.5.21 it says nothing
        if not r.spec_v2_removed_warning:
            text = f"SGLANG_ENABLE_SPEC_V2 is silently ignored by {r.name} (removed in 0.5.14; the warning "
            text += "about it is gone since 0.5.21): speculative decoding always runs the V2 worker"
        return _warning("spec-v2-env", text, "remove SGLANG_ENABLE_SPEC_V2 from engine.env")
    if r.spec_v2_env and x.shape.is_hybrid and s.strategy == "extra_buffer" and not s.is_overlap:
        text = (
            f"{r.spec_v2_env} is not set: speculative decoding runs without the overlap scheduler, "
            "so extra_buffer takes 4 Mamba slots per running request (5 with overlap)"
        )
        return _warning("spec-v2-env", text, f'set engine.env {r.spec_v2_env} = "1"')
    return Found()


SGLANG_RULES: tuple[Rule, ...] = (
    renamed_flags,
    architecture,
    hicache_hybrid,
    mem_fraction_range,
    spec_no_buffer_radix,
    extra_buffer_without_radix,
    hicache_without_radix,
    track_interval,
    no_buffer_limits,
    spec_overlap,
    linear_replayssm_spec,
)


def check_sglang_flags(x: SGLangAsk) -> Found:
    """Run every SGLang flag rule; errors and warnings in rule order."""
    found = [rule(x) for rule in SGLANG_RULES]
    return Found(
        errors=tuple(i for f in found for i in f.errors), warnings=tuple(i for f in found for i in f.warnings)
    )
