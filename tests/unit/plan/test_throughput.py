"""A plan for the job (`plan.throughput`, SGLang's settings): invariants over job shapes, GPUs and releases,
and the H200's own numbers (bench/results/grid-sglang-0.5.15-h200.md: the engine admitted the 256 it was
given)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetgen.cli import register
from fleetgen.cli.app import app
from fleetgen.config import FleetFile
from fleetgen.engines import get_engine, select_rule_set
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.plan.job import JobShape, LengthStats
from fleetgen.plan.planners import planner_of
from fleetgen.plan.sglang.memory import SGLangExtras
from fleetgen.plan.throughput import max_length_issue, plan_job
from fleetgen.plan.types import GIB, JOB_UNPLANNED, MIB, Ask
from fleetgen.plan.vllm.planner import job_blocks

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"
QWEN = load_model_shape(MODELS / "qwen3.6-27b")
SGLANG = planner_of("sglang")
MTP: dict[str, Any] = {
    "speculative-algorithm": "EAGLE",
    "speculative-num-steps": 3,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 4,
}
H200_TOTAL, H200_FREE = 143_771 * MIB, int(140.4 * GIB)


def job(prompt: int = 250, output: int = 1800, max_tokens: int = 6000, shared: float = 0.0) -> JobShape:
    return JobShape(
        prompt_tokens=LengthStats.of([prompt]),
        output_tokens=LengthStats.of([output]),
        output_from="given",
        is_output_ceiling=False,
        max_tokens=max_tokens,
        samples=1,
        thinking=True,
        shared_prefix_tokens=shared,
        counted_with="test",
        is_estimate=False,
        records_sampled=1,
        records_read=1,
        records_bad=0,
        longest_prompt_tokens=prompt,
        max_turns=1,
    )


def ask(
    version: str = "0.5.15",
    total: int = H200_TOTAL,
    free: int = H200_FREE,
    args: dict[str, Any] | None = None,
) -> Ask:
    rules, _ = select_rule_set(get_engine("sglang").rule_sets, version)
    return Ask(dict(args or {}), {}, 1, free, total, rules, QWEN)


def test_the_h200_defaults_are_capped_by_the_mamba_pool_and_the_job_settings_lift_them() -> None:
    """The fleet file of the H200 runs: 44 running (engine: 44), bound by the Mamba pool ÷ 5; radix off sizes
    the pool for the job: 249 fit its KV per request (the engine admitted exactly the 256 it was given)."""
    a = ask(args={"mem-fraction-static": 0.85, "context-length": 8192})
    planned = plan_job(SGLANG, a, SGLANG.size(a), job())
    mine = planned.as_written
    assert (mine.running, "Mamba pool" in mine.bound, "ρ 5" in mine.bound) == (44, True, True)
    same = [s for s in planned.settings if s.args["mem-fraction-static"] == 0.85 and not s.numerics]
    at_085 = max(same, key=lambda s: s.running)
    assert at_085.running == 249
    assert at_085.args["disable-radix-cache"] is True
    assert at_085.args["max-running-requests"] == 249
    # a higher static fraction runs more, up to what the job's heaviest moment leaves safe (`headroom`)
    best = planned.best
    assert best.running > 249 and best.args["mem-fraction-static"] > 0.85
    assert planned.warning is not None and f"--max-running-requests {best.running}" in planned.warning.message


def test_the_planned_kv_pool_at_256_running_is_within_5_percent_of_the_engines() -> None:
    """SGLang 0.5.15 on the H200 with radix off and 256 running reported 494,850 KV tokens (grid log)."""
    args = {"mem-fraction-static": 0.85, "context-length": 8192, "disable-radix-cache": True}
    a = ask(args={**args, "max-running-requests": 256, "mamba-radix-cache-strategy": "no_buffer"})
    m = SGLANG.size(a).memory
    assert m.max_running_requests == 256 and SGLangExtras.of(m).mamba_slots == 256
    assert abs(m.kv_tokens - 494_850) / 494_850 < 0.05


@settings(max_examples=40, deadline=None)
@given(
    prompt=st.integers(10, 4000),
    output=st.integers(50, 8000),
    gib=st.sampled_from([48, 80, 96, 141, 183]),
    spec=st.booleans(),
    version=st.sampled_from(["0.5.13", "0.5.15", "0.5.23"]),
)
def test_no_offered_setting_plans_more_than_the_gpu_holds(
    prompt: int, output: int, gib: int, spec: bool, version: str
) -> None:
    """Every setting starts under the engine's own arithmetic, runs no more than it admits, and its running
    requests' state and KV fit what the budget leaves after the weights."""
    j = job(prompt, output, max_tokens=max(output, 64))
    a = ask(version, total=gib * GIB, free=gib * GIB - GIB, args=MTP if spec else {})
    planned = plan_job(SGLANG, a, SGLANG.size(a), j)
    assert len(planned.settings) > 1 or gib < 96 or spec  # the radix-off settings fit a 96 GB GPU and up
    for s in planned.settings[1:]:
        sized = SGLANG.size(replace(a, args=s.args, env=s.env))
        m = sized.memory
        assert sized.fits, s.name
        assert 0 < s.running <= m.max_running_requests, s.name
        assert s.running * j.kv_tokens_per_request <= m.kv_tokens, s.name
        held = s.running * (m.state_bytes_per_request + j.kv_tokens_per_request * m.kv_bytes_per_token)
        assert held <= m.rest_bytes, s.name
        assert m.weights_bytes + m.rest_bytes <= gib * GIB


@settings(max_examples=25, deadline=None)
@given(prompt=st.integers(10, 4000), output=st.integers(50, 8000), spec=st.booleans())
def test_the_best_runs_at_least_the_users_own_and_never_changes_the_numbers(
    prompt: int, output: int, spec: bool
) -> None:
    a = ask(args=MTP if spec else {})
    planned = plan_job(SGLANG, a, SGLANG.size(a), job(prompt, output, max_tokens=max(output, 64)))
    assert planned.best.running >= planned.as_written.running
    assert not planned.best.numerics
    assert [s.name for s in planned.settings if s.numerics] == [
        s.name for s in planned.settings if "bfloat16" in s.name or "fp8" in s.name
    ]


def test_a_prefix_cache_that_pays_keeps_the_engines_sizing() -> None:
    """1,500 shared of 2,000 prompt tokens (a long system prompt) pays; a chat template's 8 shared tokens of a
    14-token prompt (a share of 0.57) does not, against 1,800 decoded."""
    a = ask()
    planned = plan_job(SGLANG, a, SGLANG.size(a), job(prompt=2000, shared=1500.0))
    assert [s.name for s in planned.settings] == ["as-written"] and planned.warning is None
    short = plan_job(SGLANG, a, SGLANG.size(a), job(prompt=14, shared=8.0))
    assert len(short.settings) > 1 and short.warning is not None


def test_the_replayed_ssm_decode_is_offered_from_the_release_that_has_it() -> None:
    def replays(version: str) -> bool:
        a = ask(version)
        return any(
            s.args.get("enable-linear-replayssm") for s in plan_job(SGLANG, a, SGLANG.size(a), job()).settings
        )

    assert (replays("0.5.14"), replays("0.5.15"), replays("0.5.23")) == (False, True, True)


def test_speculative_decoding_is_offered_the_other_way() -> None:
    """A spec fleet is shown what no spec yields (MTP is memory-bound at the job's batch), and back."""
    with_spec = ask(args=MTP)
    nospec = [
        s for s in plan_job(SGLANG, with_spec, SGLANG.size(with_spec), job()).settings if "nospec" in s.name
    ]
    assert nospec and all(not s.is_spec and not any("speculative" in k for k in s.args) for s in nospec)
    plain = ask()
    offered = plan_job(SGLANG, plain, SGLANG.size(plain), job()).settings
    mtp = [s for s in offered if s.name.endswith("-mtp")]
    assert mtp and all(s.is_spec and s.args["speculative-algorithm"] == "EAGLE" for s in mtp)


def test_the_hierarchical_cache_goes_with_the_radix_cache() -> None:
    a = ask(args={"enable-hierarchical-cache": True, "hicache-ratio": 2})
    for s in plan_job(SGLANG, a, SGLANG.size(a), job()).settings[1:]:
        assert "enable-hierarchical-cache" not in s.args and "hicache-ratio" not in s.args
        assert "no hierarchical cache" in s.change


def test_the_context_is_sized_to_the_job_and_the_graphs_to_the_batch() -> None:
    """6,250 tokens round up to 6,400; above the GPU tier's graph batch (256 on an H200) the decode graphs
    follow the batch, under the flag name of the release; at or under it no graph flag is added."""
    for version, flag in (("0.5.15", "cuda-graph-max-bs-decode"), ("0.5.13", "cuda-graph-max-bs")):
        a = ask(version)
        planned = plan_job(SGLANG, a, SGLANG.size(a), job(output=300, max_tokens=6000))
        best = planned.best
        assert best.args["context-length"] == 6400
        assert best.running > 256 and best.args[flag] == best.running
        small = [s for s in planned.settings[1:] if s.running <= 256]
        assert small and all(flag not in s.args for s in small)


def test_plan_for_the_job_over_the_example_fleet(tmp_path: Path) -> None:
    """`plan --job --input` over the fleet this project exists for: every instance says what bounds the job's
    running requests, warns that the defaults leave the GPU idle, and offers settings that run more; the
    input's prompts are measured (an estimate here: the example's model folder has no tokenizer)."""
    example = Path(__file__).parents[3] / "examples" / "qwen36-27b-mtp.toml"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": i, "prompt": f"{i * 7919} " + "word " * (20 + i)}) + "\n" for i in range(50)
        )
    )
    job_file = tmp_path / "job.toml"
    job_file.write_text("max_tokens = 6000\nmax_length = 4096\n")
    register(["plan"])
    argv = [
        "plan",
        "--offline",
        "--json",
        "-f",
        str(example),
        "--job",
        str(job_file),
        "--input",
        str(prompts),
    ]
    result = CliRunner().invoke(app, [*argv, "--output-lengths", "mean=1800,min=300,max=6000"])
    assert result.exit_code == 0, result.output
    for inst in json.loads(result.output)["instances"]:
        settings_ = inst["job"]["settings"]
        mine, best = settings_[0], max(settings_[1:], key=lambda s: s["running"])
        assert mine["name"] == "as-written" and mine["running"] == inst["max_running_requests"]
        assert "Mamba pool" in mine["bound"] and best["running"] > 3 * mine["running"]
        assert any(w["rule"] == "job-throughput" for w in inst["warnings"])
    past = [w for w in json.loads(result.output)["warnings"] if w["rule"] == "max-length"]
    assert len(past) == 1 and "max_tokens 6,000 + the longest prompt" in past[0]["message"], past
    missing = CliRunner().invoke(app, ["plan", "--offline", "-f", str(example), "--job", str(job_file)])
    assert missing.exit_code == 2 and "--input" in missing.output


VLLM = planner_of("vllm")


def vllm_ask(args: dict[str, Any], gib: int = 141) -> Ask:
    rules, _ = select_rule_set(get_engine("vllm").rule_sets, "0.24.0")
    return Ask(args, {}, 1, gib * GIB - GIB, gib * GIB, rules, QWEN)


@settings(max_examples=20, deadline=None)
@given(
    prompt=st.integers(10, 3000),
    output=st.integers(50, 6000),
    spec=st.booleans(),
    gib=st.sampled_from([80, 141]),
)
def test_vllm_settings_hold_their_requests_blocks(prompt: int, output: int, spec: bool, gib: int) -> None:
    """Each vLLM setting's max-num-seqs is what it plans to run, and that many of the job's requests' blocks
    fit the paged pool sized with that many sampler rows; no-spec runs at least as many as spec."""
    mtp = '{"method": "mtp", "num_speculative_tokens": 3}'
    a = vllm_ask({"gpu-memory-utilization": 0.9, **({"speculative-config": mtp} if spec else {})}, gib)
    j = job(prompt, output, max_tokens=max(output, 64))
    planned = plan_job(VLLM, a, VLLM.size(a), j)
    offered = planned.settings[1:]
    assert offered, "a 27B model on an 80 GB GPU and up has a max-num-seqs for any job"
    for s in offered:
        trial = replace(a, args=s.args)
        pool, per_request = job_blocks(trial, j)
        assert VLLM.size(trial).fits and s.running == s.args["max-num-seqs"]
        assert s.running * per_request <= pool
    plain = [s.running for s in offered if not s.is_spec and not s.numerics]
    specs = [s.running for s in offered if s.is_spec and not s.numerics]
    assert max(plain) >= max(specs)


def test_vllm_names_what_bounds_the_users_own() -> None:
    """vLLM's defaults on the H200 (1,024 max-num-seqs) are bound by the paged pool for a long-output job, and
    an explicit small max-num-seqs by itself."""
    a = vllm_ask({"gpu-memory-utilization": 0.9, "max-model-len": 8192})
    mine = plan_job(VLLM, a, VLLM.size(a), job()).as_written
    assert "paged pool" in mine.bound and mine.running < 1024
    b = vllm_ask({"gpu-memory-utilization": 0.9, "max-num-seqs": 16})
    assert plan_job(VLLM, b, VLLM.size(b), job()).as_written.bound == "max-num-seqs 16"


def _rules_of(version: str, *, args: dict[str, Any], job_shape: JobShape | None) -> list[str]:
    fleet = FleetFile.model_validate(
        {
            "engine": {"kind": "sglang", "version": version, "model": "/m", "args": args},
            "hosts": [{"name": "n", "gpus": [0], "gpu_memory_gib": 95.6}],
        }
    )
    plan = plan_fleet(fleet, QWEN, {h.name: facts_from_file(h) for h in fleet.hosts}, None, job=job_shape)
    return [w.rule for w in plan.instances[0].warnings]


@pytest.mark.parametrize("version", ["0.5.10", "0.5.15", "0.5.23"])
@pytest.mark.parametrize(
    "spec", [{}, {"speculative-algorithm": "EAGLE", "mamba-radix-cache-strategy": "extra_buffer"}]
)
def test_plan_without_a_job_says_in_one_line_that_the_radix_cache_sizes_a_hybrid_model_for_chat(
    version: str, spec: dict[str, Any]
) -> None:
    """`plan` without --job on Qwen3.6 with the radix cache: a `job-unplanned` warning pointing at
    `plan --job` / `tune` (never a silent "fits"); with --job the job's own warning replaces it; with the
    radix cache off (one state per request) there is nothing to say."""
    args = {"mem-fraction-static": 0.85, "context-length": 8192, **spec}
    assert _rules_of(version, args=args, job_shape=None).count(JOB_UNPLANNED) == 1
    with_job = _rules_of(version, args=args, job_shape=job())
    assert JOB_UNPLANNED not in with_job and "job-throughput" in with_job
    off = {**args, "disable-radix-cache": True, "mamba-radix-cache-strategy": "no_buffer"}
    assert JOB_UNPLANNED not in _rules_of(
        version, args={k: v for k, v in off.items() if k != "speculative-algorithm"}, job_shape=None
    )


@given(
    prompt=st.integers(1, 20_000),
    max_tokens=st.integers(1, 20_000),
    max_length=st.none() | st.integers(1, 40_000),
)
@example(prompt=100, max_tokens=100, max_length=200)  # exactly at the length: it fits
@example(prompt=100, max_tokens=101, max_length=200)
def test_past_max_length_is_warned_exactly_when_a_row_can_outgrow_the_trainer(
    prompt: int, max_tokens: int, max_length: int | None
) -> None:
    """`plan --job` and `run`: max_tokens + the longest prompt past the job's max_length, with the numbers."""
    shape = replace(job(prompt=prompt, max_tokens=max_tokens), max_length=max_length)
    issue = max_length_issue(shape)
    assert (issue is not None) == (max_length is not None and prompt + max_tokens > max_length)
    if issue is not None:
        assert (
            f"{prompt + max_tokens:,} tokens" in issue.message
            and f"max_length {max_length:,}" in issue.message
        )
        assert f"{prompt + max_tokens - (max_length or 0):,} tokens" in issue.message
        if max_length is not None and max_length > prompt:
            assert f"lower max_tokens to {max_length - prompt}" in issue.fix


@pytest.mark.parametrize("version", ["0.5.15", "0.5.17", "0.5.23"])
@pytest.mark.parametrize("total", [80 * GIB, H200_TOTAL])
def test_from_0_5_17_the_radix_off_settings_give_the_multimodal_ipc_pool_back_to_the_kv_pool(
    version: str, total: int
) -> None:
    """0.5.17's tokenizer holds a 1,024 MiB CUDA-IPC pool for image features and its own CUDA context before
    the scheduler sizes its pools (tests/data/real-engines/sglang-0.5.17-h100-tune/): every setting sized for
    the job carries `--mm-feature-transport cpu` (said in its change) and plans at least as many running
    requests and KV tokens as the same flags without it; before 0.5.17 none carries the flag."""
    a = ask(version, total=total, free=total)
    offered = [
        s for s in plan_job(SGLANG, a, SGLANG.size(a), job()).settings if s.name.startswith("no-radix")
    ]
    assert offered
    for s in offered:
        if version < "0.5.17":
            assert "mm-feature-transport" not in s.args and "mm-feature-transport" not in s.change
            continue
        assert s.args["mm-feature-transport"] == "cpu" and "--mm-feature-transport cpu" in s.change, s.name
        held = replace(a, args={k: v for k, v in s.args.items() if k != "mm-feature-transport"})
        with_pool, without = SGLANG.size(held).memory, SGLANG.size(replace(a, args=s.args)).memory
        assert without.kv_tokens > with_pool.kv_tokens, s.name
        assert without.free_bytes - with_pool.free_bytes == (1024 + 523) * MIB


@pytest.mark.parametrize("version", ["0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.23"])
@pytest.mark.parametrize("total", [80 * GIB, H200_TOTAL])
def test_where_the_release_gates_its_prefill_graph_on_memory_the_replayed_settings_turn_it_off(
    version: str, total: int
) -> None:
    """0.5.16–0.5.17 capture the prefill CUDA graph only where 4 GiB is left after the pools: on an H100 the
    replayed SSM decode at 0.91 (5.14 GiB left) captured it and died, at 0.93 (3.39 left) skipped it and ran
    the best measured (tests/data/real-engines/sglang-0.5.17-h100-mmcpu-tune/). There, every replayed
    setting carries `--disable-prefill-cuda-graph` (said in its change), whatever its fraction, and only
    those; no other release gets the flag."""
    a = ask(version, total=total, free=total)
    offered = [
        s for s in plan_job(SGLANG, a, SGLANG.size(a), job()).settings if s.name.startswith("no-radix")
    ]
    gated = version in ("0.5.16", "0.5.17")
    replayed = [s for s in offered if s.args.get("enable-linear-replayssm")]
    assert replayed and any("-mf" in s.name for s in replayed)  # the fraction search's replayed ones too
    for s in offered:
        off = bool(s.args.get("disable-prefill-cuda-graph"))
        assert off == (gated and s in replayed), s.name
        assert ("--disable-prefill-cuda-graph" in s.change) == off, s.change
