"""`deploy.verify`: process drift and engine-view comparisons, and the engines' capacity figures that `up`
compares with the plan there (`Engine.capacity`): pure code."""

from __future__ import annotations

from fleetgen.deploy.verify import process_drift, view_mismatches
from fleetgen.engines import get_engine
from fleetgen.remote.base import ProcInfo, ProcState
from tests.unit.deploy._helpers import SECRET, command


def _proc(argv: tuple[str, ...], env: dict[str, str]) -> ProcInfo:
    return ProcInfo(pid=1, state=ProcState.RUNNING, start_time=5, argv=argv, environ=env)


def test_drift_empty_when_equal_and_names_each_difference() -> None:
    s = command(secret=True)
    argv = s.argv
    env = {"CUDA_VISIBLE_DEVICES": "0", "QUOTE": "it's $HOME", "FLEET_KEY": SECRET, "HOME": "/root"}
    assert process_drift(s, _proc(argv, env), SECRET) == []
    drift = process_drift(
        s, _proc((*argv[:-3], "9", *argv[-2:]), {**env, "QUOTE": "x", "FLEET_KEY": "other"}), SECRET
    )
    text = "\n".join(drift)
    assert "argv differs" in text and "+ 9" in text
    assert "env QUOTE" in text and "'x'" in text
    assert "env FLEET_KEY" in text and "<different key>" in text
    assert SECRET not in text and "other" not in text
    missing = process_drift(s, _proc(argv, {"QUOTE": "it's $HOME", "FLEET_KEY": SECRET}), SECRET)
    assert missing == ["env CUDA_VISIBLE_DEVICES: rendered '0', missing in the running process"]


def test_view_mismatch_spec_reported_as_none_and_alias() -> None:
    args = [
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "3",
        "--mem-fraction-static",
        "0.8",
        "--mamba-scheduler-strategy",
        "extra_buffer",
    ]
    good = {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "mem_fraction_static": 0.8,
        "mamba_radix_cache_strategy": "extra_buffer",
    }
    sglang = get_engine("sglang")
    assert view_mismatches(args, good, sglang) == []
    bad = view_mismatches(args, {**good, "speculative_algorithm": None, "mem_fraction_static": 0.7}, sglang)
    assert len(bad) == 2 and "speculative_algorithm = None" in bad[0] and "0.7" in bad[1]


def test_capacity_from_each_engines_log_and_info() -> None:
    lines = [
        "[2026] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 12345, K size: 1 GB",
        "max_total_num_tokens=54321, chunked_prefill_size=8192, max_running_requests=21, context_len=8192",
        "INFO GPU KV cache size: 1,234 tokens",
    ]
    sglang, vllm = get_engine("sglang"), get_engine("vllm")
    assert sglang.capacity(lines, None, {}) == {"kv_tokens": 54321.0, "max_running_requests": 21.0}
    assert vllm.capacity(lines, None, {}) == {"kv_tokens": 1234.0}
    info = {"max_total_num_tokens": 99, "internal_states": [{"effective_max_running_requests_per_dp": 7}]}
    assert sglang.capacity(lines, info, {}) == {"kv_tokens": 99.0, "max_running_requests": 7.0}
