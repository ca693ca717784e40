"""`http.metrics`: load figures from engine metrics: SGLang gauges, vLLM counter rates, accept length; the
fast read of a page (only the samples fleetgen reads) against prometheus_client's whole parse, on the real
engines' pages; pure code. (`status --json`'s keys are tests/unit/fleet/test_status.py.)"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleetgen.engines import get_engine, metric_names_read
from fleetgen.errors import EndpointError
from fleetgen.http.metrics import (
    Scrape,
    accept_length,
    counter_rate,
    load_from,
    read_lines,
)

REAL = Path(__file__).parents[2] / "data" / "real-engines"
REAL_PAGES = {
    path.relative_to(REAL).as_posix(): path.read_text() for path in sorted(REAL.glob("*/**/metrics*.txt"))
}
SGLANG, VLLM = get_engine("sglang"), get_engine("vllm")

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
    assert load.spec_accept_length is None  # no speculative step between the two reads
    assert load_from(vllm, now, None).spec_accept_length == pytest.approx(1 + 30 / 40)  # its lifetime
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


@pytest.mark.parametrize(
    "text",
    [
        "vllm:num_requests_running{unclosed 1\n",  # a sample fleetgen reads, broken
        "<!DOCTYPE html><html><body>metrics</body></html>\n",  # not an engine's /metrics at all
        '{"detail": "Not Found"}',
    ],
)
def test_bad_metrics_text_is_an_endpoint_error(text: str) -> None:
    with pytest.raises(EndpointError) as err:
        Scrape.parse(text)
    assert "/metrics" in err.value.fix  # it names the fix, as every error does


def _full_parse(text: str, names: frozenset[str]) -> tuple[dict[str, float], dict[str, Mapping[str, str]]]:
    """What the whole page says of `names`, by prometheus_client's parse of every line (the old read)."""
    totals: dict[str, float] = {}
    labels: dict[str, Mapping[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
                labels.setdefault(sample.name, sample.labels)
    return totals, labels


def test_the_real_pages_are_read_for_every_figure_fleetgen_takes() -> None:
    """Each real page holds what its engine's `MetricNames.read` names (spec off: its counters aside), and
    the fast read keeps a small part of the page (SGLang's 530 lines: its dozen samples)."""
    assert len(REAL_PAGES) >= 4 and any(len(t.splitlines()) >= 500 for t in REAL_PAGES.values())
    for where, text in REAL_PAGES.items():
        engine = VLLM if where.startswith("vllm") else SGLANG
        samples = Scrape.parse(text).samples
        is_spec = "nospec" not in where
        wanted = {n for n in engine.metrics.read if is_spec or n != engine.metrics.spec_steps_total}
        assert wanted <= set(samples), (where, wanted - set(samples))
        assert len(read_lines(text, metric_names_read()).splitlines()) < 25


@settings(max_examples=60, deadline=None)
@given(
    page=st.sampled_from(sorted(REAL_PAGES)),
    data=st.data(),
)
def test_the_fast_read_equals_the_whole_parse_for_every_name_it_reads(page: str, data: st.DataObject) -> None:
    """For each real page, and any subset of its lines in any order: the samples and first labels of every
    name fleetgen reads are what prometheus_client's parse of the whole text gives."""
    names = metric_names_read()
    lines = REAL_PAGES[page].splitlines()
    read = [line for line in lines if line.split("{")[0].split(" ")[0] in names]
    chosen = data.draw(st.lists(st.sampled_from(read), unique=True))  # most pages: a few read among many
    chosen += data.draw(st.lists(st.sampled_from([x for x in lines if x not in read]), unique=True))
    picked = data.draw(st.permutations(chosen)) if data.draw(st.booleans()) else chosen
    text = "\n".join(picked) + data.draw(st.sampled_from(["\n", ""]))  # the last line's end is optional
    try:
        want = _full_parse(text, names)
    except ValueError:  # a reordering the format itself refuses (a family's TYPE after its samples)
        assume(False)
        raise
    got = Scrape.parse(text) if text else Scrape(0.0, {})
    assert (got.samples, dict(got.labels)) == want


def test_status_and_the_runs_series_read_one_accept_length() -> None:
    """`load_from` (status, the dashboard) reads the accept length over the window since its read before,
    as the run's series does: vLLM's counters over the window, not the server's life."""
    drafts, accepted = VLLM.metrics.spec_steps_total, VLLM.metrics.spec_accepted_total
    first = Scrape(1.0, {drafts: 100.0, accepted: 150.0})
    later = Scrape(4.0, {drafts: 200.0, accepted: 350.0})
    assert load_from(VLLM, later, first).spec_accept_length == accept_length(
        VLLM, later.samples, first.samples
    )
    assert load_from(VLLM, later, first).spec_accept_length == 3.0
    assert load_from(VLLM, later).spec_accept_length == 1 + 350 / 200  # no read before: its lifetime


def test_accept_length_sglang_gauge_and_vllm_counters_over_the_window() -> None:
    assert accept_length(SGLANG, {"sglang:spec_accept_length": 2.6}, None) == 2.6
    drafts, accepted = "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"
    first = {drafts: 100.0, accepted: 150.0}
    assert accept_length(VLLM, first, None) == 2.5  # lifetime until there is a window
    later = {drafts: 200.0, accepted: 350.0}
    assert accept_length(VLLM, later, first) == 3.0  # 1 + 200 / 100 in the window, not 1 + 350/200
    assert accept_length(VLLM, later, later) is None  # no speculative step in the window
    restarted = {drafts: 10.0, accepted: 5.0}
    assert accept_length(VLLM, restarted, later) == 1.5  # counters went down: the new totals
    assert accept_length(None, {"sglang:num_running_reqs": 3.0}, None) is None  # spec off
    # Bare --endpoint URLs: the engine is unknown, it is recognised from the metric names.
    assert accept_length(None, later, first) == 3.0
    assert accept_length(None, {"sglang:spec_accept_length": 2.6}, first) == 2.6
