"""Load figures from engine metrics: SGLang gauges, vLLM counter rates, accept length; pure code."""

from __future__ import annotations

import json

import pytest

from fleetgen.deploy.readiness import Readiness
from fleetgen.engines import get_engine
from fleetgen.errors import EndpointError
from fleetgen.fleet.status import InstanceStatus
from fleetgen.http.metrics import (
    Scrape,
    counter_rate,
    load_from,
)

VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="tiny"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="tiny"} 1.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="tiny"} 1000.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="tiny"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{model_name="tiny"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="1"} 10.0
"""

SGLANG_TEXT = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m",tp_rank="0"} 812.5
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.75
"""


def test_vllm_counters_give_rate_and_accept_length() -> None:
    vllm = get_engine("vllm")
    before = Scrape(10.0, Scrape.parse(VLLM_TEXT).samples)
    now = Scrape(12.0, {**before.samples, "vllm:generation_tokens_total": 1500.0})
    load = load_from(vllm, now, before)
    assert load.running == 3 and load.queued == 1
    assert load.gen_tokens_per_s == pytest.approx(250.0)
    assert load.spec_accept_length == pytest.approx(1 + 30 / 40)
    assert load_from(vllm, now, None).gen_tokens_per_s is None  # one scrape: rate unknown, not zero


def test_counter_reset_is_unknown_not_negative() -> None:
    before = Scrape(1.0, {"c": 100.0})
    assert counter_rate("c", Scrape(2.0, {"c": 5.0}), before) is None
    assert counter_rate("c", Scrape(1.0, {"c": 200.0}), before) is None
    assert counter_rate("c", Scrape(3.0, {"c": 300.0}), before) == pytest.approx(100.0)


def test_sglang_gauges_and_server_info_fallback() -> None:
    sglang, vllm = get_engine("sglang"), get_engine("vllm")
    load = load_from(sglang, Scrape(0.0, Scrape.parse(SGLANG_TEXT).samples))
    assert (load.running, load.queued, load.gen_tokens_per_s, load.spec_accept_length) == (5, 2, 812.5, 2.75)
    info = {"internal_states": [{"avg_spec_accept_length": 3.1, "effective_max_running_requests_per_dp": 21}]}
    assert load_from(sglang, Scrape(0.0, {}), None, info).spec_accept_length == pytest.approx(3.1)
    assert load_from(sglang, Scrape(0.0, {}), None, {"internal_states": [{}]}).spec_accept_length is None
    assert sglang.max_running_from_info(info) == 21
    assert sglang.max_running_from_info({"max_running_requests": 48}) == 48
    assert vllm.max_running_from_info(info) is None and vllm.accept_length({}, info) is None


def test_bad_metrics_text_is_an_endpoint_error() -> None:
    with pytest.raises(EndpointError) as err:
        Scrape.parse("vllm:x{unclosed 1\n")
    assert "/metrics" in err.value.fix  # it names the fix, as every error does


# The keys the deploy issue asks `status --json` to carry (tests/integration/test_deploy_vllm.py reuses them).
STATUS_JSON_KEYS = frozenset(
    {
        "instance",
        "host",
        "gpus",
        "pid",
        "port",
        "url",
        "ready",
        "drift",
        "uptime_s",
        "running",
        "queued",
        "gen_tokens_per_s",
        "spec_accept_length",
    }
)


def test_status_json_has_the_issue_keys() -> None:
    assert set(InstanceStatus("h0-0", "h0", (0,), 30000).to_json()) >= STATUS_JSON_KEYS


@pytest.mark.parametrize("readiness", list(Readiness))
def test_status_json_says_ready_true_only_for_ready_whatever_else_the_status_holds(
    readiness: Readiness,
) -> None:
    """`status --json` is a machine interface: `ready` stays a JSON boolean (no enum leaks into it), the
    problem text stays beside it, and the keys are the same for every readiness."""
    status = InstanceStatus(
        "h0-0", "h0", (0,), 30000, readiness=readiness, problem="not running", drift=["x"]
    )
    out = json.loads(json.dumps(status.to_json()))
    assert out["ready"] is (readiness is Readiness.READY) and out["problem"] == "not running"
    assert "readiness" not in out and set(out) == set(InstanceStatus("a", "b", (), 1).to_json())
