"""What `tune.measure` reads and forces: the engines' decode rate over a window (`Engine.decode_rate`),
forced acceptance, forced output lengths (`generate.rows.forced_length`)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgen.engines import format_args, get_engine
from fleetgen.tune.measure import expected_running, offered_running

# --- engines: decode rate over a window, forced acceptance -------------------------------------------------


def test_sglangs_decode_rate_is_its_gauge_averaged_not_its_finish_time_counter() -> None:
    """0.5.15 adds a request's tokens to generation_tokens_total when it finishes: the counter says 0 over a
    window where nothing finished, the gauge says what was decoded."""
    window = [(0.0, {"sglang:gen_throughput": 999.0, "sglang:generation_tokens_total": 5.0})] + [
        (float(t), {"sglang:gen_throughput": 1000.0 + 100 * t, "sglang:generation_tokens_total": 5.0})
        for t in (1, 2, 3)
    ]
    assert get_engine("sglang").decode_rate(window) == pytest.approx(1200.0)
    assert get_engine("sglang").decode_rate(window[:1]) is None


def test_vllms_decode_rate_is_its_counters_rise_over_the_window() -> None:
    window = [
        (10.0, {"vllm:generation_tokens_total": 100.0}),
        (14.0, {"vllm:generation_tokens_total": 900.0}),
    ]
    assert get_engine("vllm").decode_rate(window) == 200.0
    restarted = [window[1], (18.0, {"vllm:generation_tokens_total": 10.0})]
    assert get_engine("vllm").decode_rate(restarted) is None


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        ("sglang", {"speculative-algorithm": "EAGLE"}),
        ("vllm", {"speculative-config": '{"method": "mtp", "num_speculative_tokens": 3}'}),
    ],
)
def test_forcing_an_accept_length_is_what_up_refuses(kind: str, args: dict[str, Any]) -> None:
    engine = get_engine(kind)
    forced = engine.with_simulated_acceptance(args, {"A": "b"}, 3.0)
    assert forced is not None
    new_args, env = forced
    assert engine.simulated_acceptance(format_args(args), {"A": "b"}) == ()
    assert engine.simulated_acceptance(format_args(new_args), env) != ()
    assert env["A"] == "b"


def test_the_load_offers_what_the_engine_admits_or_the_jobs_plan_where_that_is_more() -> None:
    """SGLang says its hard cap (263: all of it is offered); vLLM says its concurrency at max-model-len, a
    floor (105 on the H200, where the job's plan runs 244: offered 244, not the floor); unknown: the plan."""
    assert offered_running(263, 255) == 263
    assert offered_running(105, 244) == 244
    assert offered_running(None, 244) == 244


def test_a_window_is_held_against_what_both_the_plan_and_the_engine_expect() -> None:
    """The fewer of the two: vLLM-CPU says max-num-seqs 512 where the job's KV runs 125 (planned): a window
    at 125 is the setting's rate, not a hold; the H100's MTP candidate, 11 planned and admitted, ran 1."""
    assert expected_running(512, 125) == 125
    assert expected_running(11, 11) == 11
    assert expected_running(None, 58) == 58
    assert expected_running(105, 244) == 105
    assert expected_running(None, 0) == 0
