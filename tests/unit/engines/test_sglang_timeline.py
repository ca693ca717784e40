"""SGLang's rule sets of 0.5.7 … 0.5.23 against what each release's source says, and plans per release.

`EXPECTED` is the table of facts read from every wheel (`pip download --no-deps sglang==X`, files and
functions cited in `fleetgen.engines.sglang_timeline`), written out here release by release so that a wrong
first-release in the timeline fails. `test_timeline_matches_the_wheels` re-reads marker strings from the
extracted wheels FLEETGEN_SGLANG_SRC points at (scripts/install-sglang-src.sh: CI installs them; locally the
test skips without them, under CI it fails).
GPU sizes as in test_plan: "96 GB" = 97,887 MiB, "183 GB" = 183,359 MiB; free = total.
"""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path

import pytest

from fleetgen.config import load_fleet
from fleetgen.deploy.death import first_fatal
from fleetgen.engines import get_engine, select_rule_set
from fleetgen.engines.base import ParserVerdict
from fleetgen.engines.rules import release
from fleetgen.engines.sglang import extra_buffer_fix
from fleetgen.engines.sglang_timeline import RELEASES, RULE_SETS, TIMELINE, SGLangRules, rules_for
from fleetgen.fleet.planning import parser_refusal
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.plan.sglang.memory import LOAD_OVERHEAD_BYTES, SGLangExtras, cuda_context_bytes
from tests.fixtures import skip_or_fail
from tests.fixtures.planmodels import GPU96, GPU183, MODELS, MOTIVATING, QWEN, plan_one

GIB = 1 << 30
P = 153_944_064  # Qwen3.6-27B state bytes per request, TP 1, fp32 SSM

# release: strategy flag (S = mamba-scheduler-strategy, R = mamba-radix-cache-strategy), old names
# (ok / dep = deprecated alias / gone), spec+no_buffer+radix, SPEC_V2 (env default; - = removed),
# spec reserve MB, draft weights+KV in budget, ratio rule, mamba pool solve, explicit MRR cap,
# auto→extra_buffer, explicit no_buffer asserts, extra_buffer+no-radix raises, VLM reserve MB, 20–35 GiB tier
EXPECTED = """
0.5.7        S ok   unchecked 0 2048 no  by-spec-quirk ratio-scratch     none        no  no  no  0   2048
0.5.8        S ok   unchecked 0 2048 no  by-spec       scratch-first-512 none        no  no  no  0   2048
0.5.8.post1  S ok   unchecked 0 2048 no  by-spec       scratch-first-512 none        no  no  no  0   2048
0.5.9        S ok   radix_off 0 2048 no  by-spec       scratch-first     none        no  no  no  0   2048
0.5.10       S ok   raises    0 4096 no  by-overlap    scratch-first     estimate    no  no  yes 0   2048
0.5.10.post1 S ok   raises    0 4096 no  by-overlap    scratch-first     estimate    no  no  yes 0   2048
0.5.11       S ok   raises    1 4096 no  by-overlap    scratch-first     estimate    no  no  yes 0   2048
0.5.12       S ok   raises    1 4096 no  by-overlap    scratch-first     estimate    no  no  yes 0   2048
0.5.12.post1 S ok   raises    1 4096 no  by-overlap    scratch-first     estimate    no  no  yes 0   2048
0.5.13       S ok   raises    1 4096 no  by-overlap    joint             estimate    no  no  yes 0   2048
0.5.13.post1 S ok   raises    1 4096 no  by-overlap    joint             estimate    no  no  yes 0   2048
0.5.14       R dep  gone      - 0    yes by-overlap    joint             half-tokens yes yes no  0   2048
0.5.15       R dep  gone      - 0    yes by-overlap    joint             half-tokens yes yes no  0   2048
0.5.15.post1 R dep  gone      - 0    yes by-overlap    joint             half-tokens yes yes no  0   2048
0.5.16       R dep  gone      - 0    yes by-overlap    joint             half-tokens yes yes no  0   2048
0.5.17       R dep  gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  0   2048
0.5.18       R dep  gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  100 2048
0.5.19       R dep  gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  100 2048
0.5.20       R gone gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  100 4096
0.5.21       R gone gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  100 4096
0.5.22       R gone gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  100 4096
0.5.23       R gone gone      - 0    yes by-overlap    joint-padded      half-tokens yes yes no  100 4096
"""
ROWS = [line.split() for line in EXPECTED.strip().splitlines()]
FLAG = {"S": "mamba-scheduler-strategy", "R": "mamba-radix-cache-strategy"}
YES = {"yes": True, "no": False}


def test_every_release_read_has_a_row_and_a_rule_set_named_after_it() -> None:
    assert [row[0] for row in ROWS] == list(RELEASES)
    assert [r.name for r in RULE_SETS] == [f"sglang-{v}" for v in RELEASES]
    assert get_engine("sglang").rule_sets == RULE_SETS


def test_every_timeline_value_of_a_switch_is_one_its_type_names() -> None:
    """`rules_for` builds the rule sets from `TIMELINE` as `Any`: mypy cannot see a typo in a switch's value
    there, so each `Literal`-typed field's values are checked here (and each feature is a field)."""
    hints = typing.get_type_hints(SGLangRules)
    switches = {name for name, hint in hints.items() if typing.get_origin(hint) is typing.Literal}
    assert {"spec_no_buffer_radix", "mamba_ratio_rule", "mamba_pool_solve", "mrr_cap"} <= switches
    for change in TIMELINE:
        assert change.feature in hints, change
        if change.feature in switches:
            assert change.value in typing.get_args(hints[change.feature]), change


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_rule_set_matches_what_the_release_source_says(row: list[str]) -> None:
    release, flag, old, spec_radix, v2, reserve, draft, ratio, solve, cap, auto, nb, eb, vlm, tier = row
    r = rules_for(release)
    assert r.strategy_flag == FLAG[flag]
    old_names = {x.old: x for x in r.renames}
    if old == "ok":  # the new names do not exist yet: they are translated back
        assert "mamba-radix-cache-strategy" in old_names and "cuda-graph-max-bs-decode" in old_names
        assert "cuda-graph-max-bs-prefill" in r.removed_flags
    else:
        assert old_names["mamba-scheduler-strategy"].still_accepted == (old == "dep")
        assert old_names["cuda-graph-max-bs"].new == ("cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill")
        assert "disable-cuda-graph" in r.deprecated_flags and not r.removed_flags
    assert r.spec_no_buffer_radix == spec_radix
    assert (r.spec_v2_env, r.spec_v2_default) == (
        ("", False) if v2 == "-" else ("SGLANG_ENABLE_SPEC_V2", v2 == "1")
    )
    assert r.spec_reserve_mb == int(reserve)
    assert r.draft_weights_in_budget == r.draft_kv_in_budget == YES[draft]
    assert (r.mamba_ratio_rule, r.mamba_pool_solve, r.mrr_cap) == (ratio, solve, cap)
    assert r.mamba_pool_solve.startswith("joint") == solve.startswith("joint")
    assert r.auto_strategy_extra_buffer == YES[auto] and r.explicit_no_buffer_needs_no_overlap == YES[nb]
    assert r.rejects_extra_buffer_without_radix == YES[eb]
    assert r.vlm_cache_reserve_mb == int(vlm) and r.gpu_tier_35g[0] == int(tier)


def first_release(feature: str, value: object) -> str | None:
    """The first release read where `feature` has `value` (None: never)."""
    return next((r for r in RELEASES if getattr(rules_for(r), feature) == value), None)


def test_first_releases_of_the_headline_behaviours() -> None:
    assert first_release("spec_no_buffer_radix", "radix_off") == "0.5.9"
    assert first_release("spec_no_buffer_radix", "raises") == "0.5.10"
    assert first_release("spec_v2_default", True) == "0.5.11"
    assert first_release("mamba_pool_solve", "joint") == "0.5.13"
    assert first_release("draft_kv_in_budget", True) == "0.5.14"
    assert first_release("strategy_flag", "mamba-radix-cache-strategy") == "0.5.14"
    assert first_release("spec_v2_removed_warning", True) == "0.5.14"
    assert first_release("mamba_pool_solve", "joint-padded") == "0.5.17"
    assert first_release("missing_archs", frozenset()) == "0.5.9"
    assert first_release("hicache_hybrid", True) == "0.5.10"


# --- plans across releases ------------------------------------------------------------------------------


def test_0_5_8_does_not_check_spec_no_buffer_radix_warns_and_plans() -> None:
    """Qwen3-Next (0.5.8 has no Qwen3.5 model): spec + no_buffer + radix cache starts; ρ 3 (no_buffer)."""
    plan = plan_one(dict(MOTIVATING), version="0.5.8", model="qwen3-next-80b-a3b", gpu_gib=GPU183, tp=2)
    assert plan.rules == "sglang-0.5.8" and plan.fits, plan.errors
    warning = next(w for w in plan.warnings if w.rule == "spec-no-buffer-radix")
    assert "does not check" in warning.message and "extra_buffer" in warning.fix
    assert plan.resolved["mamba_strategy"] == "no_buffer" and SGLangExtras.of(plan.memory).mamba_ratio == 3


def test_0_5_8_has_no_qwen3_5_model() -> None:
    plan = plan_one(dict(MOTIVATING), version="0.5.8")
    assert any(
        e.rule == "architecture" and "Qwen3_5ForConditionalGeneration" in e.message for e in plan.errors
    )


def test_0_5_9_turns_radix_cache_off_with_a_warning_instead_of_refusing() -> None:
    plan = plan_one(dict(MOTIVATING), version="0.5.9", gpu_gib=GPU183)  # 96 GB: 48 x 4 scratch leaves no KV
    assert plan.fits, plan.errors
    warning = next(w for w in plan.warnings if w.rule == "spec-no-buffer-radix")
    assert warning.message.startswith(
        "Disabling radix cache since speculative decoding for Qwen3_5ForConditionalGeneration is not "
        "supported with radix cache yet."
    )
    m = plan.memory
    sg = SGLangExtras.of(m)
    assert sg.mamba_ratio == 1 and sg.mamba_slots == 48  # radix off: one slot per request, MRR 48 (spec)
    assert m.max_running_requests == 48 and sg.spec_scratch_bytes == P * 48 * 4


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("0.5.8.post1", False),
        ("0.5.9", False),
        ("0.5.10", True),
        ("0.5.12", True),
        ("0.5.13.post1", True),
        ("0.5.14", False),
        ("0.5.23", False),
    ],
)
def test_motivating_flags_verdict_per_release(version: str, refused: bool) -> None:
    model = "qwen3-next-80b-a3b" if version.startswith("0.5.8") else "qwen3.6-27b"
    plan = plan_one(dict(MOTIVATING), version=version, model=model, gpu_gib=GPU183, tp=2)
    assert any(e.rule == "spec-no-buffer-radix" for e in plan.errors) == refused


# SGLang's own words, verbatim from the 0.5.13 wheel (server_args.py `_handle_mamba_radix_cache`: two string
# literals that meet without a space, "no_buffer.To"); reproduced by 0.5.13's own prepare_server_args on this
# argv (bench/results/raw/gpu-sglang-0.5.13-h200/precheck-cpu.txt).
SGLANG_0_5_13_REFUSAL = (
    "Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache when using "
    "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
    "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
)
NO_BUFFER = {**MOTIVATING, "mamba-scheduler-strategy": "no_buffer"}  # spec + no_buffer; radix cache left on


@pytest.mark.parametrize("version", RELEASES)
def test_spec_no_buffer_radix_is_refused_in_sglangs_words_exactly_until_the_check_was_removed(
    version: str,
) -> None:
    """Every release read: spec + no_buffer + radix cache is a plan error quoting SGLang's ValueError verbatim
    from the first release that raises (0.5.10) up to the one that dropped the check (0.5.14: upstream
    removed it on 2026-06-19, after 0.5.13 of 06-15); never before (unchecked / radix silently off) nor
    after. Where it is refused, the fix it names (extra_buffer under the release's flag, or no radix cache)
    is accepted; from the removal on, the combination itself plans clean once overlap is off (0.5.14+
    asserts no_buffer without overlap: a different check, its own rule)."""
    first, removed = (
        first_release("spec_no_buffer_radix", "raises"),
        first_release("spec_no_buffer_radix", "gone"),
    )
    assert first == "0.5.10" and removed == "0.5.14"
    v = release(version)
    model = "qwen3-next-80b-a3b" if v < release("0.5.9") else "qwen3.6-27b"  # no Qwen3.5 model before 0.5.9
    plan = plan_one(dict(NO_BUFFER), version=version, model=model, gpu_gib=GPU183)
    refusals = [e for e in plan.errors if e.rule == "spec-no-buffer-radix"]
    if release(first) <= v < release(removed):
        assert [e.message for e in refusals] == [SGLANG_0_5_13_REFUSAL]
        flag = rules_for(version).strategy_flag
        assert refusals[0].fix.startswith(f'set engine.args {flag} = "extra_buffer"')
        assert "disable-radix-cache = true" in refusals[0].fix
        for fixed in ({**NO_BUFFER, flag: "extra_buffer"}, {**NO_BUFFER, "disable-radix-cache": True}):
            after = plan_one(fixed, version=version, gpu_gib=GPU183)
            assert not after.errors and after.fits, (fixed, after.errors)
        return
    assert not refusals
    if v >= release(removed):
        accepted = plan_one({**NO_BUFFER, "disable-overlap-schedule": True}, version=version, gpu_gib=GPU183)
        assert not accepted.errors and accepted.fits, accepted.errors


H200_REFUSAL = Path(__file__).parents[3] / "bench" / "gpu" / "sglang-0.5.13-h200-refusal.toml"


@pytest.mark.parametrize("version", ["0.5.13", "0.5.15"])
def test_the_h200_refusal_fleet_file_is_refused_in_sglangs_words_on_0_5_13_only(
    version: str, tmp_path: Path
) -> None:
    """The fleet file the H200 fault runs (bench/gpu) loads as written, and plan (with the H200's 140.4 GiB
    stated) quotes SGLang's refusal for it on 0.5.13; on 0.5.15 that check is gone (explicit no_buffer then
    meets 0.5.14's no-overlap assertion instead: a different rule)."""
    text = H200_REFUSAL.read_text().replace('version = "0.5.13"', f'version = "{version}"')
    path = tmp_path / "fleet.toml"
    path.write_text(text.replace("gpus = [0]", "gpus = [0]\ngpu_memory_gib = 140.4"))
    fleet = load_fleet(path)
    plan = plan_fleet(fleet, QWEN, {h.name: facts_from_file(h) for h in fleet.hosts}, None).instances[0]
    refusals = [e.message for e in plan.errors if e.rule == "spec-no-buffer-radix"]
    assert refusals == ([SGLANG_0_5_13_REFUSAL] if version == "0.5.13" else [])
    assert plan.rules == f"sglang-{version}" and not plan.fits
    assert any(e.rule == "no-buffer-overlap" for e in plan.errors) == (version == "0.5.15")


# SGLang 0.5.13's own prepare_server_args on fleetgen's argv for that fleet file (bench/results/raw).
PRECHECK = Path(__file__).parents[3] / "bench/results/raw/gpu-sglang-0.5.13-h200/precheck-cpu.txt"


@pytest.mark.parametrize("planned", ["0.5.13", "0.5.15"])
def test_the_hosts_parser_refusing_in_a_rules_words_gets_that_rules_fix(planned: str, tmp_path: Path) -> None:
    """The host's 0.5.13 parser raised the refusal's ValueError (its real text): the `engine-parser` error
    gives the rule's fix, never "change the flag it names": plan's own for the instance when plan predicted
    it (planned with 0.5.13), else the engine's for the release the host reports (planned with 0.5.15, where
    the check is gone). 0.5.13 has the V2 worker on by default: no SGLANG_ENABLE_SPEC_V2 in the fix."""
    [error] = [x for x in PRECHECK.read_text().splitlines() if x.startswith("ValueError: ")]
    path = tmp_path / "fleet.toml"
    text = H200_REFUSAL.read_text().replace('version = "0.5.13"', f'version = "{planned}"')
    path.write_text(text.replace("gpus = [0]", "gpus = [0]\ngpu_memory_gib = 140.4"))
    fleet = load_fleet(path)
    plan = plan_fleet(fleet, QWEN, {h.name: facts_from_file(h) for h in fleet.hosts}, None).instances[0]
    sglang = get_engine("sglang")
    issue = parser_refusal(sglang, "h200", ParserVerdict(False, "0.5.13", error), plan)
    assert issue.rule == "engine-parser" and issue.message.endswith(error) and "h200" in issue.message
    assert issue.fix == extra_buffer_fix(rules_for("0.5.13")) and "SGLANG_ENABLE_SPEC_V2" not in issue.fix
    predicted = [e.fix for e in plan.errors if e.rule == "spec-no-buffer-radix"]
    assert predicted == ([issue.fix] if planned == "0.5.13" else [])
    # an argument the parser names (no rule's words) keeps the renamed-flag advice
    argument = ParserVerdict(False, "0.5.13", "argument error: unrecognized arguments: --not-a-flag 1")
    assert "renamed-flag" in parser_refusal(sglang, "h200", argument, plan).fix


# SGLang 0.5.13's own log line (the CPU rehearsal of the H200 refusal, bench/results/raw).
REFUSAL_LOG = (
    Path(__file__).parents[3] / "bench/results/raw/gpu-sglang-0.5.13-h200/rehearsal-cpu/engine-alone.log"
)


@pytest.mark.parametrize("version", RELEASES)
def test_the_logs_fix_for_the_spec_radix_refusal_is_plans_for_every_release(version: str) -> None:
    """`up` reads SGLang's refusal of spec + no_buffer + radix cache in the log; its fix is the one `plan`
    gives under the same release (one source): SGLANG_ENABLE_SPEC_V2=1 only where the release reads it and it
    is off (before 0.5.11; on by default 0.5.11-0.5.13, gone from 0.5.14), under the release's flag name."""
    [line] = [x for x in REFUSAL_LOG.read_text().splitlines() if x.startswith("ValueError: Speculative")]
    rules = rules_for(version)
    hit = first_fatal([line, "INFO: loading"], get_engine("sglang").fatal_signatures_for(rules))
    assert hit is not None and hit[1] == line
    fix = hit[0].fix
    assert ("SGLANG_ENABLE_SPEC_V2" in fix) == (release(version) < release("0.5.11"))
    assert fix.startswith(f'set engine.args {rules.strategy_flag} = "extra_buffer"')
    planned = plan_one(dict(MOTIVATING), version=version)
    said = [i.fix for i in (*planned.errors, *planned.warnings) if i.rule == "spec-no-buffer-radix"]
    assert said == ([fix] if rules.spec_no_buffer_radix != "gone" else [])


def test_0_5_12_spec_v2_is_on_by_default_so_extra_buffer_takes_5_slots() -> None:
    extra = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer"}
    assert SGLangExtras.of(plan_one(extra, version="0.5.12").memory).mamba_ratio == 5
    assert SGLangExtras.of(plan_one(extra, version="0.5.10").memory).mamba_ratio == 4  # opt-in before 0.5.11
    off = plan_one(extra, version="0.5.12", env={"SGLANG_ENABLE_SPEC_V2": "0"})
    assert SGLangExtras.of(off.memory).mamba_ratio == 4
    refused = plan_one(dict(MOTIVATING), version="0.5.12")
    fix = refused.fixes[0]
    assert fix.args == {"mamba-scheduler-strategy": "extra_buffer"} and not fix.env  # env is on already


def test_0_5_9_extra_buffer_ratio_follows_spec_not_overlap() -> None:
    extra = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer"}
    plan = plan_one(extra, version="0.5.9", env={"SGLANG_ENABLE_SPEC_V2": "1"})
    assert plan.resolved["overlap_schedule"]
    assert SGLangExtras.of(plan.memory).mamba_ratio == 4  # init_memory_pool: spec → 4


def test_flag_names_0_5_13_vs_0_5_15_vs_0_5_23() -> None:
    old = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer", "cuda-graph-max-bs": 32}
    mid = plan_one(old, version="0.5.15")
    renamed = [w for w in mid.warnings if w.rule == "renamed-flag"]
    assert len(renamed) == 2 and all("is deprecated in sglang-0.5.15" in w.message for w in renamed)
    assert "--mamba-radix-cache-strategy" in mid.argv and "--cuda-graph-max-bs-decode" in mid.argv
    new = plan_one(old, version="0.5.23")
    assert all(
        "is not accepted by sglang-0.5.23" in w.message for w in new.warnings if w.rule == "renamed-flag"
    )
    fresh = {**MOTIVATING, "mamba-radix-cache-strategy": "extra_buffer", "cuda-graph-max-bs-decode": 32}
    back = plan_one(fresh, version="0.5.13")
    assert "--mamba-scheduler-strategy" in back.argv and "--cuda-graph-max-bs" in back.argv
    assert "--mamba-radix-cache-strategy" not in back.argv and SGLangExtras.of(back.memory).mamba_ratio == 5


def test_disable_cuda_graph_is_deprecated_not_refused_in_0_5_23() -> None:
    plan = plan_one({"disable-cuda-graph": True}, version="0.5.23")
    assert plan.fits and any(w.rule == "deprecated-flag" for w in plan.warnings)
    assert "--disable-cuda-graph" in plan.argv


# The MTP head allocates its own embedding and LM head at load (vocab × hidden × bf16, twice, untied)
DRAFT_VOCAB_TABLES = 2 * 248_320 * 5_120 * 2


def _joint(gpu_gib: float, padded: bool, vlm_mib: int, cell: int) -> tuple[int, int, int]:
    """`handle_max_mamba_cache` joint solve (0.5.13–0.5.16 unpadded, 0.5.17+ padded), written out again."""
    pad, d, rho = int(padded), 4, 5
    weights = QWEN.weight_bytes + LOAD_OVERHEAD_BYTES + DRAFT_VOCAB_TABLES
    held = ((1024 + 523) << 20) * padded  # 0.5.17+: the tokenizer's CUDA-IPC pool (multimodal) + its context
    rest = (
        (gpu_gib * GIB - cuda_context_bytes(int(gpu_gib * GIB)) - held) * 0.9 - weights - vlm_mib * (1 << 20)
    )
    budget = rest * 0.9 / 1.9
    slots = int((budget - pad * P * (1 + d)) // (P * (1 + d / rho)))
    running = min(48, slots // rho)
    tokens = int(rest - P * (running + pad) * d - (slots + pad) * P) // cell
    return slots, tokens, running


@pytest.mark.parametrize(
    ("version", "padded", "vlm_mib", "cell"),
    [("0.5.15", False, 0, 65_536), ("0.5.17", True, 0, 65_536), ("0.5.19", True, 100, 69_632)],
)
def test_joint_solve_variants(version: str, padded: bool, vlm_mib: int, cell: int) -> None:
    """A path-less MTP head's KV joins the target's cell only from 0.5.19 (before: its own pool, outside)."""
    m = plan_one(dict(MOTIVATING), version=version, gpu_gib=GPU183).memory  # auto → extra_buffer, ρ 5
    slots = SGLangExtras.of(m).mamba_slots
    assert (slots, m.kv_tokens, m.max_running_requests) == _joint(GPU183, padded, vlm_mib, cell)
    weights = QWEN.weight_bytes + LOAD_OVERHEAD_BYTES + DRAFT_VOCAB_TABLES
    assert m.weights_bytes == weights and m.kv_bytes_per_token == cell


def test_0_5_8_reserves_the_scratch_even_with_an_explicit_pool() -> None:
    args = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer", "max-mamba-cache-size": 40}
    shape = load_model_shape(MODELS / "qwen3-next-80b-a3b")
    m8 = plan_one(args, version="0.5.8", model="qwen3-next-80b-a3b", gpu_gib=GPU183, tp=2).memory
    m7 = plan_one(args, version="0.5.7", model="qwen3-next-80b-a3b", gpu_gib=GPU183, tp=2).memory
    assert SGLangExtras.of(m8).spec_scratch_bytes == m8.state_bytes_per_request * 48 * 4
    assert SGLangExtras.of(m7).spec_scratch_bytes == 0
    assert m7.kv_tokens > m8.kv_tokens and shape.mtp_layers == 1


@pytest.mark.parametrize(("version", "reserve_mb"), [("0.5.9", 2048), ("0.5.10", 4096), ("0.5.14", 0)])
def test_default_mem_fraction_keeps_the_release_spec_reserve(version: str, reserve_mb: int) -> None:
    plan = plan_one({k: v for k, v in MOTIVATING.items() if k != "mem-fraction-static"}, version=version)
    total = 97_887
    reserved = max(512 + 8192 * 1.5 + 1 / 8 * 1024 + 256 * 2, 10 * 1024) + reserve_mb
    vlm = 0.95 * (1 - 0.1 * (24 * 1152**2 / (24 * 1024**2) - 1))
    mfs = SGLangExtras.of(plan.memory).mem_fraction_static
    assert mfs == pytest.approx(round((total - reserved) / total, 3) * vlm)


def test_32gb_gpu_tier_changed_in_0_5_20() -> None:
    old, new = (
        SGLangExtras.of(plan_one({}, version=v, model="llama-3.1-8b", gpu_gib=32).memory).mem_fraction_static
        for v in ("0.5.19", "0.5.20")
    )
    total = 32 * 1024
    assert old == round((total - (512 + 2048 * 1.5 + 128 + 24 * 2)) / total, 3)
    assert new == round((total - (512 + 4096 * 1.5 + 128 + 48 * 2)) / total, 3)


def test_explicit_max_running_requests_cap_per_release() -> None:
    args = {"mem-fraction-static": 0.85, "max-running-requests": 300_000}
    caps = {}
    for version in ("0.5.9", "0.5.13", "0.5.14"):
        m = plan_one(args, version=version, model="llama-3.1-8b", gpu_gib=80).memory
        caps[version] = (m.max_running_requests, m.kv_tokens)
    assert caps["0.5.9"][0] == 300_000  # kept as asked (model_runner.py)
    tokens = caps["0.5.13"][1]
    assert caps["0.5.13"][0] == max(min(int(tokens / 131_072 * 512), 4096), 2048)
    assert caps["0.5.14"][0] == caps["0.5.14"][1] // 2 < 300_000


def test_track_interval_is_a_bare_assertion_from_0_5_14() -> None:
    args = {**MOTIVATING, "mamba-radix-cache-strategy": "extra_buffer", "mamba-track-interval": 2}
    error = next(e for e in plan_one(args, version="0.5.15").errors if e.rule == "track-interval")
    assert error.message.startswith("AssertionError (no message")


def test_hicache_before_0_5_10_keeps_no_mamba_host_pool() -> None:
    args = {"mem-fraction-static": 0.9, "enable-hierarchical-cache": True, "context-length": 8192}
    old = plan_one(args, version="0.5.9")
    new = plan_one(args, version="0.5.10")
    assert any(w.rule == "hicache-hybrid" for w in old.warnings)
    assert not any(w.rule == "hicache-hybrid" for w in new.warnings)
    pinned = SGLangExtras.of(old.memory).hicache_host_bytes
    assert pinned == int(2.0 * old.memory.kv_tokens * old.memory.kv_bytes_per_token)


def test_version_strings_pick_the_release_read() -> None:
    rule_sets = get_engine("sglang").rule_sets
    assert select_rule_set(rule_sets, "0.5.10.post1")[0].name == "sglang-0.5.10.post1"
    assert select_rule_set(rule_sets, "0.5.15+cu128") == (rules_for("0.5.15"), None)
    rules, warning = select_rule_set(rule_sets, "0.5.23rc0")
    assert rules.name == "sglang-0.5.23" and warning and "pre-release" in warning
    rules, warning = select_rule_set(rule_sets, "0.6.0")
    assert rules.name == "sglang-0.5.23" and warning and "newer than the newest" in warning
    rules, warning = select_rule_set(rule_sets, "0.5.6.post2")
    assert rules.name == "sglang-0.5.7" and warning and "older than the oldest" in warning
    assert plan_one({}, version="0.5.15+cu128", gpu_gib=GPU96).rules == "sglang-0.5.15"


# --- opt-in: re-read the wheels ---------------------------------------------------------------------------

SRC = os.environ.get("FLEETGEN_SGLANG_SRC", "")
MARKERS = {  # (feature value the marker implies, regex found somewhere under sglang/srt/*.py)
    "radix_off": r"Disabling radix cache since speculative decoding for \{model_arch\}",
    "raises": r"is not compatible with radix cache when using",
    "spec_v2_true": r"SGLANG_ENABLE_SPEC_V2 = EnvBool\(True\)",
    "joint": r"Not enough GPU memory for hybrid",
    "padded": r"\(mamba_budget_bytes - per_req \* \(1 \+ D\)",
    "new_flag": r'"--mamba-radix-cache-strategy"|mamba_radix_cache_strategy: A\[',
    "old_flag": r'"--mamba-scheduler-strategy"',
    "draft_kv": r"eagle_draft_num_layers\) / int\(num_layers\)|draft_kv_size = int\(",
    "replayssm": r"enable_linear_replayssm: A\[",
    "replayssm_spec": r"enable_linear_replayssm_spec: A\[",
    "skip_decode_lock": r"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK = EnvBool",
    "prefill_graph_gate": r"_MIN_AUTO_PREFILL_CUDA_GRAPH_FREE_MEMORY_GB = ",
}


def _found(release: str) -> set[str]:
    root = Path(SRC) / release / "sglang" / "srt"
    text = "\n".join(p.read_text(errors="replace") for p in root.rglob("*.py"))
    return {name for name, pattern in MARKERS.items() if re.search(pattern, text)}


@pytest.mark.parametrize("release", RELEASES)
def test_timeline_matches_the_wheels(release: str) -> None:
    if not (Path(SRC) / release / "sglang" / "srt").is_dir() or not SRC:
        skip_or_fail(
            "SGLang's source", "run scripts/install-sglang-src.sh DIR and set FLEETGEN_SGLANG_SRC=DIR"
        )
    found, r = _found(release), rules_for(release)
    assert ("radix_off" in found) == (r.spec_no_buffer_radix == "radix_off")
    assert ("raises" in found) == (r.spec_no_buffer_radix == "raises")
    assert ("spec_v2_true" in found) == r.spec_v2_default
    assert ("joint" in found) == r.mamba_pool_solve.startswith("joint") and ("padded" in found) == (
        r.mamba_pool_solve == "joint-padded"
    )
    assert ("new_flag" in found) == (r.strategy_flag == "mamba-radix-cache-strategy")
    gone = any(x.old == "mamba-scheduler-strategy" and not x.still_accepted for x in r.renames)
    assert ("old_flag" in found) == (not gone)
    assert ("draft_kv" in found) == r.draft_kv_in_budget
    assert ("replayssm" in found) == r.has_linear_replayssm
    assert ("replayssm_spec" in found) == r.has_linear_replayssm_spec
    assert ("skip_decode_lock" in found) == r.has_skip_decode_lock
    assert ("prefill_graph_gate" in found) == r.auto_prefill_graph_gate
