"""Flag rules (quoting SGLang's own errors), fleet-wide rules, ranked fixes, target concurrency, vLLM, CLI.

Filed under `plan` as a whole: `plan/sglang/rules.py` (flag rules), `plan/fleet.py` (fleet-wide rules,
`engine_rejections`), `plan/fixes.py` (fixes, target concurrency), `plan/vllm/memory.py`, `cli/plan.py`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetgen.cli.app import app
from fleetgen.config import FleetFile
from fleetgen.engines import get_engine
from fleetgen.engines.sglang_timeline import RELEASES, rules_for
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import FleetPlan, HostFacts, engine_rejections, facts_from_file, plan_fleet
from fleetgen.plan.fixes import MIN_TOKENS_PER_REQUEST
from fleetgen.plan.sglang.memory import SGLangExtras
from fleetgen.plan.types import GIB, GpuFacts, Issue
from fleetgen.plan.vllm.memory import VLLMExtras
from tests.fixtures.planmodels import (
    EXTRA,
    GPU96,
    GPU183,
    MODELS,
    MOTIVATING,
    QWEN,
    SPEC_V2,
    plan_one,
)


def _load_commands() -> None:
    """Register every topic's commands as `fleetgen.cli.main` does (a one-command app drops its name)."""
    import importlib

    from fleetgen.cli import _TOPICS

    for topic in _TOPICS:
        try:
            importlib.import_module(f"fleetgen.cli.{topic}")
        except ModuleNotFoundError as exc:
            if exc.name != f"fleetgen.cli.{topic}":
                raise


_load_commands()


def _rules(plan: Any) -> set[str]:
    return {e.rule for e in plan.errors}


def test_extra_buffer_with_disable_radix_cache() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA, "disable-radix-cache": True}, env=SPEC_V2)
    error = next(e for e in plan.errors if e.rule == "extra-buffer-no-radix")
    assert error.message.startswith("mamba extra_buffer is not compatible with --disable-radix-cache")


def test_hicache_with_disable_radix_cache() -> None:
    plan = plan_one({"enable-hierarchical-cache": True, "disable-radix-cache": True}, version="0.5.23")
    assert "hicache-no-radix" in _rules(plan)


def test_track_interval_shorter_than_draft() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA, "mamba-track-interval": 2}, env=SPEC_V2)
    error = next(e for e in plan.errors if e.rule == "track-interval")
    assert (
        error.message
        == "mamba_track_interval 2 must be greater than or equal to speculative_num_draft_tokens 4"
    )


def test_fraction_outside_unit_interval() -> None:
    assert "mem-fraction-static" in _rules(plan_one({"mem-fraction-static": 1.2}, version="0.5.23"))


def test_explicit_no_buffer_with_overlap_on_0_5_23() -> None:
    plan = plan_one({"mamba-radix-cache-strategy": "no_buffer"}, version="0.5.23")
    assert "no-buffer-overlap" in _rules(plan)
    ok = plan_one(
        {"mamba-radix-cache-strategy": "no_buffer", "disable-overlap-schedule": True}, version="0.5.23"
    )
    assert ok.fits and SGLangExtras.of(ok.memory).mamba_ratio == 3


def test_spec_v2_env_is_gone_in_0_5_23() -> None:
    """0.5.14–0.5.20 log that the variable was removed; 0.5.21+ no longer mention it at all."""
    plan = plan_one(dict(MOTIVATING), env=SPEC_V2, version="0.5.23")
    assert any(w.rule == "spec-v2-env" and "silently ignored" in w.message for w in plan.warnings)
    plan = plan_one(dict(MOTIVATING), env=SPEC_V2, version="0.5.20")
    assert any(w.rule == "spec-v2-env" and "has been removed" in w.message for w in plan.warnings)


def test_unknown_version_uses_nearest_with_warning() -> None:
    fleet = _fleet([{"name": "n", "gpus": [0], "gpu_memory_gib": GPU96}], version="0.5.40")
    result = plan_fleet(fleet, QWEN, _facts(fleet), None)
    assert result.instances[0].rules == "sglang-0.5.23"
    assert any(w.rule == "rule-set" and "nearest" in w.message for w in result.warnings)


def _fleet(
    hosts: list[dict[str, Any]],
    *,
    args: dict[str, Any] | None = None,
    version: str = "0.5.23",
    kind: str = "sglang",
    tp: int = 1,
) -> FleetFile:
    return FleetFile.model_validate(
        {
            "engine": {"kind": kind, "version": version, "model": "/m", "tp": tp, "args": args or {}},
            "hosts": hosts,
        }
    )


def _facts(fleet_file: FleetFile) -> dict[str, HostFacts]:
    return {h.name: facts_from_file(h) for h in fleet_file.hosts}


def test_two_instances_on_one_gpu_and_port_clash() -> None:
    hosts = [
        {"name": "a", "ssh": "u@10.0.0.1", "gpus": [0, 1], "gpu_memory_gib": GPU96},
        {"name": "b", "ssh": "u@10.0.0.1:22", "gpus": [1], "gpu_memory_gib": GPU96},
    ]
    result = plan_fleet(_fleet(hosts), QWEN, _facts(_fleet(hosts)), None)
    rules = {e.rule for e in result.errors}
    assert rules == {"gpu-shared", "port-clash"}
    assert not result.fits


def test_gpu_index_absent_on_the_host() -> None:
    fleet = _fleet([{"name": "a", "gpus": [0, 5], "gpu_memory_gib": GPU96}])
    measured = HostFacts(
        "a", gpus=(GpuFacts(0, 80 * GIB, 80 * GIB, True), GpuFacts(1, 80 * GIB, 80 * GIB, True))
    )
    result = plan_fleet(fleet, QWEN, {"a": measured}, None)
    good, bad = result.instances
    assert good.gpus == (0,) and good.fits  # GPU 0 is there: its instance is planned as usual
    assert [e.rule for e in bad.errors] == ["gpu-absent"] and "GPU 5" in bad.errors[0].message
    assert not result.fits


def test_hicache_host_memory_over_the_limit() -> None:
    hosts = [{"name": "a", "gpus": [0, 1, 2, 3], "gpu_memory_gib": GPU96, "host_memory_gib": 64}]
    fleet = _fleet(hosts, args={**MOTIVATING, "enable-hierarchical-cache": True, "context-length": 8192})
    result = plan_fleet(fleet, QWEN, _facts(fleet), None)
    error = next(e for e in result.errors if e.rule == "hicache-host-memory")
    assert "Not enough host memory available. Requesting" in error.message
    pinned = sum(SGLangExtras.of(i.memory).hicache_host_bytes for i in result.instances)
    assert f"{pinned / 1e9:.2f} GB" in error.message


def test_wont_fit_gives_fixes_ranked_by_cost_that_really_fit() -> None:
    plan = plan_one({**MOTIVATING, **EXTRA, "max-mamba-cache-size": 120}, env=SPEC_V2)
    assert not plan.fits and {"mamba-pool", "kv-cache"} & _rules(plan)
    assert plan.fixes
    costs = [f.cost for f in plan.fixes]
    assert costs == sorted(costs)
    for fix in plan.fixes:
        if fix.tp:
            continue
        again = plan_one(
            {**MOTIVATING, **EXTRA, "max-mamba-cache-size": 120, **fix.args}, env={**SPEC_V2, **fix.env}
        )
        assert again.fits and again.memory.max_running_requests == fix.max_running_requests


@settings(max_examples=25, deadline=None)
@given(
    gpu_gib=st.sampled_from([GPU96, 139.9, GPU183]),
    context=st.sampled_from([4096, 8192, 32768]),
    version=st.sampled_from(["0.5.10", "0.5.13", "0.5.15"]),
    strategy=st.sampled_from(["no_buffer", "extra_buffer"]),
)
def test_every_offered_fix_gives_each_running_request_its_share_of_the_kv_pool(
    gpu_gib: float, context: int, version: str, strategy: str
) -> None:
    """A fix that claims n concurrent requests leaves each of them min(context, 4096) KV tokens: on the H200
    (SGLang 0.5.13, MTP, no_buffer refused) fleetgen offered "52 concurrent, 14,811 KV tokens" (285 each)."""
    args = {**MOTIVATING, "context-length": context, "mamba-scheduler-strategy": strategy}
    plan = plan_one(args, version=version, gpu_gib=gpu_gib)
    for fix in plan.fixes:
        assert fix.kv_tokens >= fix.max_running_requests * min(context, MIN_TOKENS_PER_REQUEST), fix.change


def test_target_concurrency_solved_or_refused_with_reason() -> None:
    fleet = _fleet(
        [{"name": "a", "gpus": [0], "gpu_memory_gib": GPU183}], args={**MOTIVATING, "context-length": 8192}
    )
    solved = plan_fleet(fleet, QWEN, _facts(fleet), None, target=24).instances[0]
    fix = solved.fixes[0]
    assert fix.max_running_requests >= 24 and fix.args["max-running-requests"] == 24
    again = plan_fleet(
        _fleet(fleet.model_dump(by_alias=True)["hosts"], args=dict(fix.args)), QWEN, _facts(fleet), None
    ).instances[0]
    assert again.fits and again.memory.max_running_requests >= 24
    refused = plan_fleet(fleet, QWEN, _facts(fleet), None, target=5000).instances[0]
    error = next(e for e in refused.errors if e.rule == "target-concurrency")
    assert "5000 concurrent requests do not fit" in error.message and "at most" in error.message


def test_target_concurrency_fix_names_the_change_the_refusal_requires() -> None:
    """Under a refusal (0.5.10: spec + no_buffer + radix cache), the target's fix says the required change in
    its text too: its flags alone would be refused again."""
    fleet = _fleet([{"name": "a", "gpus": [0], "gpu_memory_gib": GPU183}], args=MOTIVATING, version="0.5.10")
    base = plan_fleet(fleet, QWEN, _facts(fleet), None).instances[0]
    assert "spec-no-buffer-radix" in _rules(base)
    fix = plan_fleet(fleet, QWEN, _facts(fleet), None, target=8).instances[0].fixes[0]
    assert fix.args["mamba-scheduler-strategy"] == "extra_buffer" and fix.env == SPEC_V2
    assert "--mamba-scheduler-strategy extra_buffer + SGLANG_ENABLE_SPEC_V2=1" in fix.change, fix.change
    assert f"→ {fix.max_running_requests} concurrent" in fix.change


def test_vllm_uses_total_memory_and_refuses_when_free_is_short() -> None:
    hosts = [{"name": "a", "gpus": [0], "gpu_memory_gib": 80, "gpu_free_gib": 60}]
    fleet = _fleet(
        hosts, kind="vllm", version="0.32.0", args={"gpu-memory-utilization": 0.9, "max-model-len": 8192}
    )
    shape = load_model_shape(MODELS / "llama-3.1-8b")
    plan = plan_fleet(fleet, shape, _facts(fleet), None).instances[0]
    assert plan.memory.budget_bytes == int(80 * GIB * 0.9)
    assert (
        plan.errors[0].rule == "gpu-memory-utilization" and "Free memory on device" in plan.errors[0].message
    )
    roomy = _fleet(
        [{"name": "a", "gpus": [0], "gpu_memory_gib": 80}],
        kind="vllm",
        version="0.32.0",
        args={"gpu-memory-utilization": 0.9, "max-model-len": 8192},
    )
    ok = plan_fleet(roomy, shape, _facts(roomy), None).instances[0]
    assert ok.fits and ok.memory.kv_tokens > 100_000 and ok.argv[3] == "serve"


def test_vllm_hybrid_keeps_state_in_the_paged_pool() -> None:
    """vLLM 0.24's hybrid allocator, written out again: GDN state in attention-sized pages, grouped layers."""
    fleet = _fleet(
        [{"name": "a", "gpus": [0], "gpu_memory_gib": GPU183}],
        kind="vllm",
        version="0.32.0",
        args={"max-model-len": 8192, "speculative-config": '{"method":"mtp","num_speculative_tokens":2}'},
    )
    m = plan_fleet(fleet, QWEN, _facts(fleet), None).instances[0].memory
    conv = (16 * 128 * 2 + 48 * 128) * (4 - 1 + 2) * 2  # bf16 conv window grows by the 2 speculative tokens
    ssm = 48 * 128 * 128 * 4  # fp32 SSM state
    block = 16 * -(-(conv + ssm) // (16 * 4096))  # attention page (4 KiB/token/layer) >= one Mamba state
    per_request = -(-8192 // block) + 3 * (
        1 + 2
    )  # 17 attention layers (16 + MTP) = 1 group; 48 GDN = 3 groups
    blocks = m.rest_bytes // (17 * block * 4096)
    vllm = VLLMExtras.of(m)
    assert vllm.block_size == block == 800 and vllm.num_blocks == blocks
    assert m.kv_tokens == int(blocks / per_request * 8192)
    assert m.max_running_requests == min(1024, blocks // per_request)  # H200-class GPUs: max_num_seqs 1024


def _write(
    tmp_path: Path,
    args: dict[str, Any],
    env: dict[str, str],
    gpu_gib: float,
    version: str,
    kind: str = "sglang",
) -> Path:
    lines = [
        "[engine]",
        f'kind = "{kind}"',
        f'version = "{version}"',
        'model = "/m"',
        f'model_config = "{MODELS / "qwen3.6-27b"}"',
        "[engine.args]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in args.items()]
    lines += ["[engine.env]"] + [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[[hosts]]", 'name = "n"', "gpus = [0]", f"gpu_memory_gib = {gpu_gib}"]
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_exit_2_with_ranked_fixes_and_json(tmp_path: Path) -> None:
    runner = CliRunner()
    refused = runner.invoke(
        app, ["plan", "--offline", "-f", str(_write(tmp_path, MOTIVATING, {}, GPU96, "0.5.10"))]
    )
    assert refused.exit_code == 2
    assert "spec-no-buffer-radix" in refused.output and "fix 1 (cost 0)" in refused.output
    path = _write(tmp_path, {**MOTIVATING, **EXTRA}, SPEC_V2, GPU183, "0.5.10")
    ok = runner.invoke(app, ["plan", "--offline", "--json", "-f", str(path)])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["instances"][0]["fits"] and data["instances"][0]["max_running_requests"] > 0


@pytest.mark.parametrize(
    ("kind", "version", "own", "other"),
    [
        ("sglang", "0.5.23", "mem-fraction-static", "gpu-memory-utilization"),
        ("vllm", "0.11.0", "gpu-memory-utilization", "mem-fraction-static"),
    ],
)
def test_the_plan_table_names_each_engines_own_rows(
    tmp_path: Path, kind: str, version: str, own: str, other: str
) -> None:
    """Each engine names its own rows: vLLM's budget setting is gpu-memory-utilization (it once printed as
    SGLang's "mem fraction"), and only SGLang has a Mamba pool."""
    path = _write(tmp_path, {}, {}, GPU183, version, kind=kind)
    result = CliRunner().invoke(app, ["plan", "--offline", "-f", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert own in result.output and other not in result.output and "mem fraction" not in result.output
    assert ("Mamba slots" in result.output) == (kind == "sglang")


def test_example_fleet_file_plans_offline() -> None:
    example = Path(__file__).parents[3] / "examples" / "qwen36-27b-mtp.toml"
    result = CliRunner().invoke(app, ["plan", "--offline", "--json", "-f", str(example)])
    assert result.exit_code == 0, result.output
    instances = json.loads(result.output)["instances"]
    assert len(instances) == 11 and all(i["fits"] and i["max_running_requests"] >= 7 for i in instances)


def _one_fitting_one_not() -> tuple[Any, Any]:
    """Two real instance plans of one host: GPU 0 present (fits), GPU 5 absent (does not)."""
    fleet = _fleet([{"name": "a", "gpus": [0, 5], "gpu_memory_gib": GPU96}])
    measured = HostFacts("a", gpus=(GpuFacts(0, 80 * GIB, 80 * GIB, True),))
    good, bad = plan_fleet(fleet, QWEN, {"a": measured}, None).instances
    return good, bad


@given(st.lists(st.booleans(), max_size=4), st.booleans())
@settings(max_examples=30, deadline=None)
def test_a_fleet_fits_only_when_every_instance_fits_and_no_fleet_rule_fails(
    fitting: list[bool], clash: bool
) -> None:
    """One instance that does not fit, or one fleet-wide error (a port clash), and the fleet does not fit;
    an empty fleet fits (nothing to refuse)."""
    good, bad = _one_fitting_one_not()
    errors = (Issue("port-clash", "a-0 and a-1 both listen on 30000"),) if clash else ()
    plan = FleetPlan(instances=tuple(good if f else bad for f in fitting), errors=errors)
    assert plan.fits == (all(fitting) and not clash)
    assert plan.to_json()["fits"] == plan.fits


# What the memory arithmetic estimates (it may be off): never a reason for `up` to refuse a launch.
ESTIMATES = frozenset(
    {"mamba-pool", "weights", "kv-cache", "weights-exceed-gpu", "gpu-unknown", "gpu-absent", "headroom"}
)
UGLY_FLAGS: dict[str, Any] = {
    "speculative-algorithm": "EAGLE",
    "speculative-num-draft-tokens": 4,
    "mamba-scheduler-strategy": "no_buffer",
    "mamba-radix-cache-strategy": "extra_buffer",
    "disable-radix-cache": True,
    "enable-hierarchical-cache": True,
    "mamba-track-interval": 2,
    "page-size": 16,
    "disable-overlap-schedule": True,
    "cuda-graph-max-bs-prefill": 8,
    "max-running-requests": 4096,
    "context-length": 1_000_000,
}


@settings(max_examples=150, deadline=None)
@given(
    flags=st.sets(st.sampled_from(sorted(UGLY_FLAGS))),
    mfs=st.sampled_from([None, 0.9, 1.5, 0.0]),
    version=st.sampled_from(RELEASES),
    gpu_gib=st.sampled_from([None, 0.5, 23.5, GPU183]),
    model=st.sampled_from(["qwen3.6-27b", "qwen3-next-80b-a3b", "llama-3.1-8b"]),
)
def test_engine_rejections_are_plans_flag_errors_whatever_the_gpu(
    flags: set[str], mfs: float | None, version: str, gpu_gib: float | None, model: str
) -> None:
    """What `up` refuses on is exactly plan's errors minus the memory arithmetic's estimates, with plan's
    words and fix, named by instance; the same on a GPU too small for the weights, a huge one, or an
    unknown one (the rules read no GPU figure)."""
    args = {k: UGLY_FLAGS[k] for k in flags} | ({"mem-fraction-static": mfs} if mfs is not None else {})
    host = {"name": "n", "gpus": [0]} | ({"gpu_memory_gib": gpu_gib} if gpu_gib else {})
    fleet = _fleet([host], args=args, version=version)
    shape = load_model_shape(MODELS / model)
    [inst] = fleet.instances()
    refused = engine_rejections(fleet, [inst], shape, _facts(fleet))
    assert all(e.message.startswith("n-0: ") for e in refused)
    bare = [replace(e, message=e.message.removeprefix("n-0: ")) for e in refused]
    rules = rules_for(version)
    for e in bare:  # where the engine's log (or its parser) says it in these words: the same fix
        said = [s for s in get_engine("sglang").rejection_signatures_for(rules) if s.search(e.message)]
        assert all(s.fix == e.fix for s in said if e.rule != "track-interval")  # plan's names the number
    sized = [
        e for e in plan_fleet(fleet, shape, _facts(fleet)).instances[0].errors if e.rule not in ESTIMATES
    ]
    if gpu_gib:
        assert bare == sized
    else:  # no GPU facts: plan sizes nothing, the rules still hold
        big = _fleet([host | {"gpu_memory_gib": GPU183}], args=args, version=version)
        assert bare == [
            e for e in plan_fleet(big, shape, _facts(big)).instances[0].errors if e.rule not in ESTIMATES
        ]
