"""The statistics behind `fleetgen bench`: percentiles, levels, accept length, speedups, stream accounting.

Filed under `bench/stats.py`, with the `http` readers (`parse_event`, `Scrape`) as bench uses them."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.bench.stats import (
    BenchLoad,
    BenchTarget,
    LevelResult,
    RequestSample,
    build_level,
    capped_levels,
    make_prompt,
    pooled_accept_length,
    read_event,
    speedups,
    summarize,
    tokens_per_chunk,
)
from fleetgen.engines import Engine, get_engine
from fleetgen.http.client import parse_event
from fleetgen.http.metrics import Scrape, counter_deltas
from fleetgen.http.request import Sampling

FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(FINITE, min_size=1, max_size=200))
def test_percentiles_match_numpy_linear(values: list[float]) -> None:
    stats = summarize(values)
    assert stats is not None
    for got, q in ((stats.p50, 50), (stats.p90, 90), (stats.p99, 99)):
        assert got == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)
    assert stats.mean == pytest.approx(float(np.mean(values)), rel=1e-9, abs=1e-6)


def test_summarize() -> None:
    assert summarize([]) is None
    stats = summarize([4.0, 1.0, 3.0, 2.0])
    assert stats is not None
    assert (stats.p50, stats.mean) == (2.5, 2.5)
    assert stats.p99 == pytest.approx(3.97)


@pytest.mark.parametrize(
    ("requested", "cap", "expected"),
    [
        ((1, 8, 32, 128, 512), None, (1, 8, 32, 128, 512)),
        ((1, 8, 32, 128, 512), 48, (1, 8, 32, 48)),
        ((1, 8, 32), 32, (1, 8, 32)),
        ((512, 8, 8, 0, 1), 1000, (1, 8, 512)),
        ((64, 128), 16, (16,)),
    ],
)
def test_capped_levels(requested: tuple[int, ...], cap: int | None, expected: tuple[int, ...]) -> None:
    assert capped_levels(requested, cap) == expected


def test_num_requests_scales_with_concurrency_and_instances() -> None:
    load = BenchLoad(rounds=3, min_requests=10)
    assert load.num_requests(1, 1) == 10
    assert load.num_requests(8, 1) == 24
    assert load.num_requests(8, 4) == 96


VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} %d
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} %d
"""


def test_a_scrape_sums_label_sets() -> None:
    text = VLLM_METRICS % (3, 5) + VLLM_METRICS.splitlines()[2].replace('"0"', '"1"').replace(" %d", " 4\n")
    values = Scrape.parse(text).samples
    assert values["vllm:spec_decode_num_drafts_total"] == 7.0
    assert values["vllm:spec_decode_num_accepted_tokens_total"] == 5.0


def accept_length_from_metrics(
    before: dict[str, float], after: dict[str, float], engine: Engine
) -> float | None:
    return engine.accept_length(counter_deltas(before, after))


def test_accept_length_from_vllm_counter_deltas() -> None:
    engine = get_engine("vllm")
    before = Scrape.parse(VLLM_METRICS % (100, 150)).samples
    after = Scrape.parse(VLLM_METRICS % (300, 550)).samples
    # 200 verify steps accepted 400 draft tokens: 2 per step plus the bonus token.
    assert accept_length_from_metrics(before, after, engine) == pytest.approx(3.0)
    assert accept_length_from_metrics(after, after, engine) is None


def test_accept_length_from_sglang_gauge() -> None:
    engine = get_engine("sglang")
    text = '# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name="m"} 2.75\n'
    assert accept_length_from_metrics({}, Scrape.parse(text).samples, engine) == 2.75
    assert accept_length_from_metrics({}, {}, engine) is None
    assert accept_length_from_metrics({}, Scrape.parse(VLLM_METRICS % (1, 1)).samples, engine) is None


def sglang_metrics(accept: float, generated: int) -> dict[str, float]:
    return Scrape.parse(
        "# TYPE sglang:spec_accept_length gauge\n"
        f'sglang:spec_accept_length{{model_name="m"}} {accept}\n'
        "# TYPE sglang:generation_tokens counter\n"
        f'sglang:generation_tokens_total{{model_name="m"}} {generated}\n'
    ).samples


def test_pooled_accept_length_never_adds_gauges_across_endpoints() -> None:
    before = [sglang_metrics(0, 100), sglang_metrics(0, 100)]
    same = [sglang_metrics(2.5, 600), sglang_metrics(2.5, 1100)]
    assert pooled_accept_length(before, same) == pytest.approx(2.5)  # two engines at 2.5: not 5.0
    # Pooled as tokens / verify steps: 500 tokens at 2 (250 steps) + 1000 at 4 (250 steps) = 1500 / 500.
    mixed = [sglang_metrics(2.0, 600), sglang_metrics(4.0, 1100)]
    assert pooled_accept_length(before, mixed) == pytest.approx(3.0)
    # vLLM counters per endpoint; an endpoint without metrics ({}) is left out.
    vllm = [Scrape.parse(VLLM_METRICS % (100, 150)).samples, {}]
    vllm_after = [Scrape.parse(VLLM_METRICS % (300, 550)).samples, {}]
    assert pooled_accept_length(vllm, vllm_after) == pytest.approx(3.0)
    assert pooled_accept_length([{}, {}], [{}, {}]) is None


def sample(
    tokens: int, chunks: int, *, ok: bool = True, ttft: float = 0.1, prompt: int = 10
) -> RequestSample:
    s = RequestSample(
        is_ok=ok,
        ttft_s=ttft,
        num_chunks=chunks,
        output_tokens=tokens,
        prompt_tokens=prompt,
        error="" if ok else "HTTP 500",
    )
    s.itls.extend([0.01] * max(chunks - 1, 0))
    return s


def test_tokens_per_chunk_counts_only_successes() -> None:
    assert tokens_per_chunk([sample(30, 10), sample(10, 10), sample(99, 1, ok=False)]) == 2.0
    assert tokens_per_chunk([sample(5, 1, ok=False)]) is None


def test_build_level_folds_samples() -> None:
    samples = [
        sample(100, 100, ttft=0.2, prompt=50),
        sample(100, 50, ttft=0.4, prompt=70),
        sample(0, 0, ok=False),
    ]
    level = build_level(BenchTarget("fleet", ("http://a", "http://b")), 4, samples, 2.0, None)
    assert (level.num_requests, level.num_failed, level.num_instances) == (3, 1, 2)
    assert level.output_tokens == 200
    assert level.output_tok_s == 100.0
    assert level.requests_s == 1.0
    assert level.mean_input_tokens == 60.0
    assert level.ttft_s is not None and level.ttft_s.p50 == pytest.approx(0.3)
    assert level.itl_s is not None and level.itl_s.p99 == pytest.approx(0.01)
    assert level.first_error == "HTTP 500"
    assert level.accept_length is None
    assert level.tokens_per_chunk == pytest.approx(200 / 150)


def level(target: str, concurrency: int, tok_s: float, accept: float | None = None) -> LevelResult:
    return LevelResult(
        target,
        1,
        concurrency,
        10,
        0,
        1.0,
        int(tok_s),
        10.0,
        tok_s,
        1.0,
        None,
        None,
        accept,
        None,
    )


def test_speedups_pair_by_target_and_concurrency() -> None:
    off = [level("a", 1, 100.0), level("a", 8, 400.0), level("b", 1, 0.0)]
    on = [level("a", 1, 250.0, 2.6), level("a", 32, 999.0, 2.0), level("b", 1, 50.0)]
    rows = speedups(off, on)
    assert [(r.target, r.concurrency, r.speedup, r.accept_length) for r in rows] == [
        ("a", 1, 2.5, 2.6),
        ("b", 1, 0.0, None),
    ]


def test_read_event_times_reasoning_and_content_chunks() -> None:
    s = RequestSample()
    start = 100.0
    events = [
        ({"choices": [{"delta": {"role": "assistant"}}]}, 100.05),
        ({"choices": [{"delta": {"reasoning_content": "hm"}}]}, 100.25),  # SGLang's name
        ({"choices": [{"delta": {"reasoning": "so"}}]}, 100.30),  # vLLM 0.32's
        ({"choices": [{"delta": {"content": "ok"}}]}, 100.50),
        ({"choices": [], "usage": {"completion_tokens": 7, "prompt_tokens": 3}}, 100.6),
    ]
    last = start
    for event, now in events:  # as the engine client yields them
        last = read_event(s, parse_event(event), now, start, last)
    assert s.ttft_s == pytest.approx(0.25)
    assert list(s.itls) == pytest.approx([0.05, 0.20])
    assert (s.num_chunks, s.output_tokens, s.prompt_tokens) == (3, 7, 3)
    assert last == 100.50


def test_bench_requests_keep_their_lengths_and_stream() -> None:
    sampling = Sampling(thinking=False, top_k=5, extra_body={"max_tokens": 9, "stream": False})
    body = BenchLoad(sampling=sampling).requests("m", 64).body([{"role": "user", "content": "hi"}])
    assert body["ignore_eos"] is True
    assert body["max_tokens"] == 64 and body["stream"] is True  # bench's own fields win over the sampling's
    assert body["stream_options"] == {"include_usage": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["top_k"] == 5 and body["messages"] == [{"role": "user", "content": "hi"}]
    assert "ignore_eos" not in BenchLoad(ignore_eos=False).requests("m", 1).body([])
    assert BenchLoad().requests("m", 1).body([])["temperature"] == 0.0


def test_make_prompt_is_seeded_and_sized() -> None:
    a = make_prompt(50, random.Random(1))
    assert a == make_prompt(50, random.Random(1))
    assert a != make_prompt(50, random.Random(2))
    assert len(a.split()) == 50
