"""SGLang 0.5.17's throughput levers in the plan, each from its source (FLEETGEN_SGLANG_SRC re-reads the
first releases in test_sglang_timeline): `SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK` (environ.py; ρ in
kv_cache_configurator.py `_calculate_mamba_ratio`) offered as an engine env candidate, named as such;
`--enable-linear-replayssm-spec` for MTP (server_args.py, its refusals in its words; its fold window charged
per Mamba slot in place of the intermediate SSM snapshots: configs/mamba_utils.py)."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.plan.sglang.memory import SGLangExtras, spec_ring_bytes, state_bytes_per_request
from fleetgen.plan.sglang.settings import SKIP_DECODE_LOCK_ENV, sglang_ask
from fleetgen.plan.throughput import plan_job
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.fleetfile import file_data, tuned_text
from tests.unit.plan.test_real_engines import tune_job
from tests.unit.plan.test_throughput import MTP, QWEN, SGLANG, ask
from tests.unit.tune._helpers import _two_class_fleet, measured

DEFAULTS = {"mem-fraction-static": 0.85, "context-length": 8192}


@pytest.mark.parametrize(
    ("version", "env", "args", "ratio"),
    [
        ("0.5.17", {SKIP_DECODE_LOCK_ENV: "1"}, {}, 4),  # extra_buffer with overlap: 5 − 1
        ("0.5.17", {SKIP_DECODE_LOCK_ENV: "y"}, {"disable-overlap-schedule": True}, 3),  # 4 − 1 (EnvBool: y)
        ("0.5.17", {SKIP_DECODE_LOCK_ENV: "1"}, {"mamba-radix-cache-strategy": "no_buffer"}, 3),  # added back
        ("0.5.17", {SKIP_DECODE_LOCK_ENV: "on"}, {}, 5),  # "on" is no EnvBool true: unset
        ("0.5.17", {}, {}, 5),
        ("0.5.16", {SKIP_DECODE_LOCK_ENV: "1"}, {}, 5),  # the release does not read it
    ],
)
def test_the_skip_decode_lock_takes_one_mamba_slot_per_request_off_extra_buffer_where_read(
    version: str, env: dict[str, str], args: dict[str, object], ratio: int
) -> None:
    a = replace(ask(version=version, args={**DEFAULTS, **args}), env=env)
    assert sglang_ask(a).settings.mamba_ratio == ratio


def test_the_skip_decode_lock_is_an_engine_env_candidate_on_0_5_17_only() -> None:
    """On the H200 (the tune job): the user's flags with the env run 55 where they ran 44 (ρ 4 of 220 slots);
    named as an engine env candidate; 0.5.15 has no such switch."""
    for version, offered in (("0.5.15", False), ("0.5.17", True)):
        a = ask(version=version, args=DEFAULTS)
        plan = plan_job(SGLANG, a, SGLANG.size(a), tune_job())
        found = [s for s in plan.settings if SKIP_DECODE_LOCK_ENV in s.env]
        assert bool(found) == offered
        if found:
            [s] = found
            assert s.args == a.args and s.env[SKIP_DECODE_LOCK_ENV] == "1"
            assert "engine env candidate" in s.change and "ρ 4" in s.bound
            assert s.running > plan.as_written.running


def test_mtp_with_the_replayed_spec_verify_is_offered_on_0_5_17_with_the_snapshots_memory_freed() -> None:
    a = ask(version="0.5.17", args=DEFAULTS)
    plan = plan_job(SGLANG, a, SGLANG.size(a), tune_job())
    plain = max(
        (s for s in plan.settings if s.name.endswith("-mtp") and "replayssm" not in s.name),
        key=lambda s: s.running,
    )
    fold = max((s for s in plan.settings if s.name.endswith("-replayssm-spec-mtp")), key=lambda s: s.running)
    assert fold.args["enable-linear-replayssm-spec"] is True and fold.is_spec
    assert "--enable-linear-replayssm-spec" in fold.change and fold.running > plain.running
    old = ask(version="0.5.15", args=DEFAULTS)
    assert not any(
        "replayssm-spec" in o.name for o in plan_job(SGLANG, old, SGLANG.size(old), tune_job()).settings
    )
    # the pool: no spec scratch, each slot its state and its 4-token fold window
    sized = SGLANG.size(replace(a, args=dict(fold.args)))
    extras = SGLangExtras.of(sized.memory)
    per_slot = state_bytes_per_request(QWEN, 1, "float32") + spec_ring_bytes(QWEN, 1, 4)
    assert extras.spec_scratch_bytes == 0 and extras.mamba_pool_bytes == (extras.mamba_slots + 1) * per_slot


def test_the_fold_window_is_what_0_5_17_charges_per_slot() -> None:
    """`replayssm_ring_bytes_per_req(record_len=D)`: per linear layer raw v, k in bf16, beta and g in fp32."""
    hv, hk = QWEN.linear_num_value_heads, QWEN.linear_num_key_heads
    dv, dk = QWEN.linear_value_head_dim, QWEN.linear_key_head_dim
    per_layer = 4 * (hv * dv * 2 + hk * dk * 2 + hv * 4 + hv * 4)
    assert spec_ring_bytes(QWEN, 1, 4) == per_layer * len(QWEN.linear_layer_ids)


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ({"speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8}, "replayssm-spec-topk"),
        ({"enable-linear-replayssm": True}, "replayssm-spec-and-decode"),
    ],
)
def test_the_replayed_spec_verify_is_refused_in_sglangs_words(extra: dict[str, object], rule: str) -> None:
    args = {**DEFAULTS, **MTP, "disable-radix-cache": True, "enable-linear-replayssm-spec": True, **extra}
    sized = SGLANG.size(ask(version="0.5.17", args=args))
    assert rule in [e.rule for e in sized.errors]
    text = next(e.message for e in sized.errors if e.rule == rule)
    assert text.startswith("--enable-linear-replayssm-spec")


def test_an_env_winner_goes_to_the_tuned_files_engine_env(tmp_path: Path) -> None:
    path = _two_class_fleet(tmp_path)
    fleet = Fleet.load(path)
    base = dict(fleet.file.engine.args)
    small, big = GpuClass(96, 1), GpuClass(179, 1)
    win = replace(
        plan_job(SGLANG, ask(args=DEFAULTS), SGLANG.size(ask(args=DEFAULTS)), tune_job()).as_written,
        name="as-written-skip-decode-lock",
        args=base,
        env={SKIP_DECODE_LOCK_ENV: "1"},
    )
    other = replace(win, env={})
    for chosen, gains in (({small: win, big: win}, True), ({small: win, big: other}, False)):
        text = tuned_text(
            file_data(fleet.file, path),
            path,
            {c: measured(s, 1000.0, c) for c, s in chosen.items()},
            {"rtx": small, "b200": big},
            {small: None, big: None},
            ["t"],
        )
        env = tomllib.loads(text)["engine"].get("env", {})
        assert (env.get(SKIP_DECODE_LOCK_ENV) == "1") == gains
        assert (f"[engine.env] gains {SKIP_DECODE_LOCK_ENV}=1" in text) == gains
