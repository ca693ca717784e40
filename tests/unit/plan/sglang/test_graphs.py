"""The decode CUDA-graph limit in the plan: SGLang's (`plan.sglang.throughput.graph_limit`), its default
by GPU memory re-read from each release's `_handle_gpu_memory_settings` (server_args.py,
FLEETGEN_SGLANG_SRC), the plan saying where the job's running pass it (decode runs eager), and the settings
raising it only where the headroom model holds the graphs' memory, the engine's limit offered beside (tune
measures across it); vLLM's capture size (config/vllm.py) said the same way."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.engines.sglang import sglang_rules
from fleetgen.plan.sglang.memory import gpu_tier
from fleetgen.plan.sglang.throughput import graph_limit
from fleetgen.plan.throughput import plan_job
from fleetgen.plan.types import MIB
from fleetgen.plan.vllm.planner import job_blocks
from fleetgen.plan.vllm.throughput import graph_requests, job_bound
from tests.fixtures import skip_or_fail
from tests.unit.plan.test_real_engines import tune_job
from tests.unit.plan.test_throughput import H200_FREE, H200_TOTAL, SGLANG, ask, job, vllm_ask

RELEASES = ("0.5.15", "0.5.17")


@pytest.mark.parametrize("version", RELEASES)
def test_the_default_graph_limit_is_the_releases_own(version: str) -> None:
    """Each GPU-memory tier's `decode_cuda_graph_config.max_bs` (tp < 4 and tp ≥ 4) as the release sets it."""
    src = os.environ.get("FLEETGEN_SGLANG_SRC", "")
    path = Path(src) / version / "sglang" / "srt" / "server_args.py"
    if not src or not path.exists():
        skip_or_fail(
            f"SGLang {version}'s source",
            "FLEETGEN_SGLANG_SRC unset or without it: scripts/install-sglang-src.sh DIR",
        )
    text = path.read_text()
    body = text[text.index("def _handle_gpu_memory_settings") :]
    body = body[: body.index("# Set cuda graph batch sizes")]
    rules = sglang_rules(ask(version).rules)
    found = list(re.finditer(r"\n( +)(?:el)?if gpu_mem < (\d+) \* 1024:", body))
    outer_else = body.index(f"\n{found[0].group(1)}else:", found[-1].end())  # the tier from 160 GiB
    ends = [m.start() for m in found[1:]] + [outer_else]
    for m, end in zip(found, ends, strict=True):
        graphs = [int(n) for n in re.findall(r"max_bs = (\d+)", body[m.end() : end])]
        mib = int(m.group(2)) * 1024 - 1
        assert (gpu_tier(mib, 1, rules)[1], gpu_tier(mib, 4, rules)[1]) == (graphs[0], graphs[-1]), mib
    biggest = [int(n) for n in re.findall(r"max_bs = (\d+)", body[outer_else : outer_else + 600])]
    assert gpu_tier(200 * 1024, 1, rules)[1] == gpu_tier(200 * 1024, 4, rules)[1] == biggest[0]


def test_the_h200_plan_says_where_decode_runs_eager_and_offers_both_sides_of_the_limit() -> None:
    """The tune job on the H200 (0.5.15): 259 running pass the default 256; the setting with graphs raised to
    259 and the one at the engine's 256 (decode past it eager, said so) are both offered."""
    a = ask(args={"mem-fraction-static": 0.85, "context-length": 8192})
    plan = plan_job(SGLANG, a, SGLANG.size(a), tune_job())
    by_name = {s.name: s for s in plan.settings}
    raised, eager = by_name["no-radix-259"], by_name["no-radix-259-graphs256"]
    assert raised.args["cuda-graph-max-bs-decode"] == 259 and "without CUDA graphs" not in raised.bound
    assert "cuda-graph-max-bs-decode" not in eager.args
    assert "decode past 256 running runs without CUDA graphs" in eager.bound


@settings(max_examples=25, deadline=None)
@given(
    gib=st.sampled_from([80, 96, 141, 183]),
    mfs=st.sampled_from([0.80, 0.85, 0.9]),
    output=st.integers(100, 3000),
    user_graphs=st.sampled_from([None, 64, 160]),
)
def test_every_setting_says_when_its_running_pass_its_decode_graphs_and_raises_them_only_where_they_fit(
    gib: int, mfs: float, output: int, user_graphs: int | None
) -> None:
    args: dict[str, object] = {"mem-fraction-static": mfs, "context-length": 8192}
    if user_graphs:
        args["cuda-graph-max-bs-decode"] = user_graphs
    total = gib << 30
    a = ask(total=total, free=total, args=args)
    if not SGLANG.size(a).fits:
        return
    engine_limit, _ = graph_limit(a, a.args)
    for s in plan_job(SGLANG, a, SGLANG.size(a), job(output=output)).settings:
        raised = s.args.get("cuda-graph-max-bs-decode", 0) > engine_limit
        if raised and "enable-linear-replayssm" not in s.args:  # (the replay rings have their own refusal)
            assert s.running > 0, (s.name, s.bound)  # graphs raised only where their memory fits
        if not s.running:
            continue
        limit, _ = graph_limit(a, s.args)
        assert (s.running > limit) == ("runs without CUDA graphs" in s.bound), (s.name, limit, s.bound)


def test_the_graph_limit_is_the_flag_given_else_the_gpus_default() -> None:
    h200 = ask(total=H200_TOTAL, free=H200_FREE)
    assert graph_limit(h200, {})[0] == 256 and "default" in graph_limit(h200, {})[1]
    assert graph_limit(h200, {"cuda-graph-max-bs-decode": 300}) == (300, "--cuda-graph-max-bs-decode 300")
    b200 = ask(total=183_359 * MIB, free=183_359 * MIB)
    assert graph_limit(b200, {})[0] == 512


@given(seqs=st.integers(1, 2048), spec=st.integers(0, 7), given_cap=st.sampled_from([None, 64, 1024]))
def test_vllms_graph_limit_is_its_capture_size_over_a_decode_steps_tokens(
    seqs: int, spec: int, given_cap: int | None
) -> None:
    """min(max_num_seqs × (1 + spec) × 2, 512) tokens unless given (config/vllm.py), ÷ (1 + spec) tokens a
    request: past it the bound says decode runs without full graphs."""
    args: dict[str, object] = {}
    if spec:
        args["speculative-config"] = json.dumps({"method": "mtp", "num_speculative_tokens": spec})
    if given_cap:
        args["max-cudagraph-capture-size"] = given_cap
    requests, cap = graph_requests(args, seqs)
    assert cap == (given_cap or min(seqs * (1 + spec) * 2, 512))
    assert requests == cap // (1 + spec)
    if not given_cap:
        assert requests >= min(seqs, 512 // (1 + spec))  # a plain batch of max_num_seqs is always covered


def test_vllm_mtp_past_its_capture_size_says_decode_runs_without_full_graphs() -> None:
    """MTP-3 (4 tokens a decode step) under a 64-token capture size: graphs cover 16 running requests."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 3})
    a = vllm_ask({"speculative-config": spec, "max-num-seqs": 200, "max-cudagraph-capture-size": 64}, 141)
    running, bound = job_bound(job_blocks, a, job(prompt=50, output=50), 200)
    assert running > 16 and "decode past 16 running runs without full CUDA graphs" in bound
    plain = vllm_ask({"speculative-config": spec, "max-num-seqs": 100}, 141)
    assert "CUDA graphs" not in job_bound(job_blocks, plain, job(prompt=50, output=50), 100)[1]
