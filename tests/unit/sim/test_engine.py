"""fleetgen.sim's batch: the roofline step model, admission capped by the Mamba arithmetic, KV retraction,
and forced speculative acceptance, all driven in simulated time (`SimScheduler.step` returns the seconds a
turn took; nothing sleeps).

The H200 settings below are the real captures' (tests/data, `../shared/data/real-engines/
sglang-0.5.15-h200-capacity`): Qwen3.6-27B shape, context 8192, mem fraction 0.85, a 140.4 GiB GPU.

Filed under `sim/engine.py` (the scheduler), with `sim/stepmodel.py`'s step times it drives.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.sim.engine import SimScheduler
from fleetgen.sim.flags import build_parser
from fleetgen.sim.memory import Capacity, compute_capacity, mamba_ratio
from fleetgen.sim.run import build_scheduler, configure, memory_inputs
from fleetgen.sim.stepmodel import FixedPace, Roofline, forced_accept_length

MODEL = Path(__file__).parents[2] / "data" / "models" / "qwen3.6-27b"
H200 = ["--context-length", "8192", "--mem-fraction-static", "0.85", "--sim-gpu-memory-gib", "140.4"]
ROOFLINE = ["--sim-bandwidth-gbs", "4800"]
NO_RADIX = ["--disable-radix-cache", "--mamba-radix-cache-strategy", "no_buffer"]
MTP = [
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]
GIB = 1 << 30


def launch(*argv: str, acc_len_env: str | None = None) -> tuple[Capacity, SimScheduler]:
    """The pools and the scheduler `python -m fleetgen.sim` would build for these flags."""
    values = vars(build_parser().parse_args(["--model-path", str(MODEL), *H200, *argv]))
    res, shape, knobs = configure(values)
    capacity = compute_capacity(memory_inputs(res.args, knobs, shape), shape)
    return capacity, build_scheduler(res.args, knobs, shape, capacity, acc_len_env)


@dataclasses.dataclass
class Trace:
    """What a simulated job did: its simulated duration, tokens, and the batch at every turn."""

    seconds: float = 0.0
    peak_running: int = 0
    peak_used: int = 0

    def tokens_per_s(self, sched: SimScheduler) -> float:
        return sum(sched.counters.generation_tokens.values()) / self.seconds


def simulate(sched: SimScheduler, num_requests: int, prompt: int, lengths: list[int]) -> Trace:
    """Submit `num_requests` requests at once (one sequence per entry of `lengths`, cycled) and step the
    scheduler until all are done, checking the batch's limits at every turn."""

    async def body() -> Trace:
        trace = Trace()
        async with contextlib.AsyncExitStack() as stack:
            for i in range(num_requests):
                out = lengths[i % len(lengths)]
                await stack.enter_async_context(sched.running(prompt, [out], out, False))
            while sched.counters.num_running or sched.counters.num_queued:
                trace.seconds += sched.step()
                trace.peak_running = max(trace.peak_running, sched.counters.num_running)
                trace.peak_used = max(trace.peak_used, sched.counters.used_tokens)
                assert sched.counters.num_running <= sched.max_running
                assert sched.counters.used_tokens <= sched.max_total_tokens
        return trace

    return asyncio.run(body())


def test_the_roofline_is_the_bytes_over_the_bandwidth() -> None:
    """One decode step reads the weights once, each request's state twice (read + write) and its KV."""
    line = Roofline(bandwidth=1e12, weight_bytes=50 * 10**9, state_bytes=10**8, kv_bytes_per_token=10**5)
    expected = line.overhead_s + (50e9 + 8 * 2e8 + 1e5 * 4000) / 1e12
    assert line.decode_seconds(8, 4000) == pytest.approx(expected)
    # speculative: 3 draft passes, then a verify pass reading the state once and writing 4 copies
    spec = dataclasses.replace(
        line,
        draft_weight_bytes=5 * 10**9,
        draft_kv_bytes_per_token=10**4,
        num_spec_steps=3,
        num_draft_tokens=4,
    )
    draft = spec.overhead_s + (5e9 + 1e4 * 4000) / 1e12
    verify = spec.overhead_s + (50e9 + 8 * 5 * 1e8 + 1e5 * 4000) / 1e12
    assert spec.decode_seconds(8, 4000) == pytest.approx(3 * draft + verify)


def test_prefill_of_many_tokens_is_compute_bound() -> None:
    line = Roofline(bandwidth=1e12, weight_bytes=50 * 10**9, state_bytes=0, kv_bytes_per_token=10**5)
    assert line.prefill_seconds(64, 16384) == pytest.approx(line.overhead_s + 16384 * 50e9 / (1e12 * 200))


@settings(max_examples=200, deadline=None)
@given(
    weights=st.integers(10**8, 10**11),
    state=st.integers(0, 10**9),
    kv=st.integers(1, 10**6),
    context=st.integers(1, 32768),
    num_reqs=st.integers(1, 1024),
    draft=st.sampled_from([0, 2, 4]),
)
def test_a_bigger_batch_steps_slower_but_never_yields_fewer_tokens_per_second(
    weights: int, state: int, kv: int, context: int, num_reqs: int, draft: int
) -> None:
    line = Roofline(
        bandwidth=4.8e12,
        weight_bytes=weights,
        state_bytes=state,
        kv_bytes_per_token=kv,
        draft_weight_bytes=weights // 10 if draft else 0,
        num_spec_steps=draft - 1 if draft else 0,
        num_draft_tokens=draft,
    )
    small = line.decode_seconds(num_reqs, num_reqs * context)
    big = line.decode_seconds(num_reqs + 1, (num_reqs + 1) * context)
    assert big > small
    assert (num_reqs + 1) / big >= num_reqs / small


@settings(max_examples=25, deadline=None)
@given(caps=st.lists(st.integers(1, 300), min_size=2, max_size=2, unique=True))
def test_throughput_grows_with_the_admitted_batch_while_memory_does_not_bind(caps: list[int]) -> None:
    """The same job (more requests than either cap) on the roofline: the larger cap decodes faster."""
    small, big = sorted(caps)
    rates = []
    for cap in (small, big):
        _, sched = launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", str(cap))
        trace = simulate(sched, num_requests=2 * big, prompt=64, lengths=[96])
        assert trace.peak_running == cap
        rates.append(trace.tokens_per_s(sched))
    assert rates[1] > rates[0]


@pytest.mark.parametrize(
    ("flags", "rho"),
    [
        ((), 5),  # auto -> extra_buffer with the overlap scheduler
        (("--mamba-radix-cache-strategy", "extra_buffer", "--disable-overlap-schedule"), 4),
        (("--mamba-radix-cache-strategy", "extra_buffer_lazy"), 4),
        (("--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"), 3),
        (("--disable-radix-cache",), 1),
    ],
)
def test_admission_is_capped_by_the_mamba_pool_over_rho(flags: tuple[str, ...], rho: int) -> None:
    capacity, sched = launch(*ROOFLINE, *flags)
    values = vars(build_parser().parse_args(["--model-path", str(MODEL), *H200, *flags]))
    res, shape, knobs = configure(values)
    assert mamba_ratio(memory_inputs(res.args, knobs, shape)) == rho
    cap = min(capacity.max_total_num_tokens // 2, capacity.mamba_cache_size // rho)
    if res.args["max_running_requests"] is not None:
        cap = min(cap, res.args["max_running_requests"])
    assert capacity.max_running_requests == sched.max_running == cap
    trace = simulate(sched, num_requests=cap + 20, prompt=32, lengths=[8])
    assert trace.peak_running == cap


def test_without_radix_cache_the_pool_is_exactly_max_running_requests() -> None:
    capacity, sched = launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", "200")
    assert capacity.mamba_cache_size == 200 == sched.max_running


def test_the_h200_defaults_admit_44_and_lose_to_radix_off_with_256() -> None:
    """Real 0.5.15 on the H200: 44 running with the defaults, 256 without the radix cache, 2.52x the
    tokens per second (256 in / 512 out). The simulation's roofline must agree on the direction and rough
    size (an upper bound: it charges no kernel inefficiency)."""
    defaults, sched_a = launch(*ROOFLINE)
    tuned, sched_b = launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", "256")
    assert (defaults.max_running_requests, tuned.max_running_requests) == (44, 256)
    a = simulate(sched_a, 512, prompt=256, lengths=[512])
    b = simulate(sched_b, 512, prompt=256, lengths=[512])
    assert (a.peak_running, b.peak_running) == (44, 256)
    assert 2.0 < b.tokens_per_s(sched_b) / a.tokens_per_s(sched_a) < 3.2


def test_mtp_at_forced_acceptance_3_loses_to_no_spec_at_256() -> None:
    """Measured: MTP with SGLANG_SIMULATE_ACC_LEN=3.0, radix off, 64 running: 0.74x no-spec at 256. Its
    state scratch (D copies per request) keeps it from a large batch: 256 running do not even fit."""
    _, mtp = launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", "64", *MTP, acc_len_env="3.0")
    _, plain = launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", "256")
    assert mtp.accept_length == 3.0
    spec = simulate(mtp, 512, prompt=256, lengths=[512])
    nospec = simulate(plain, 512, prompt=256, lengths=[512])
    ratio = spec.tokens_per_s(mtp) / nospec.tokens_per_s(plain)
    assert 0.5 < ratio < 1.0
    with pytest.raises(RuntimeError, match="Not enough memory"):
        launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", "256", *MTP)


@settings(max_examples=30, deadline=None)
@given(
    cap=st.integers(1, 64),
    pool=st.integers(600, 20000),
    prompt=st.integers(1, 300),
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=5),
    num=st.integers(1, 80),
    spec=st.booleans(),
)
def test_every_request_finishes_within_the_cap_and_the_pool(
    cap: int, pool: int, prompt: int, lengths: list[int], num: int, spec: bool
) -> None:
    """Whatever the KV pool and the cap, the batch never exceeds either (retracting when the pool fills),
    and every request gets exactly its tokens."""
    line = Roofline(bandwidth=1e12, weight_bytes=10**9, state_bytes=10**6, kv_bytes_per_token=10**4)
    sched = bare(line, cap, pool, draft=4 if spec else 0, accept=2.5)
    fits = [n for n in lengths if prompt + n + 4 <= pool]
    if not fits:
        return
    simulate(sched, num, prompt, fits)
    assert sum(sched.counters.generation_tokens.values()) == sum(fits[i % len(fits)] for i in range(num))


def bare(
    pace: Roofline | FixedPace, cap: int, pool: int, draft: int = 0, accept: float = 1.0
) -> SimScheduler:
    """A scheduler without a launch (a dense model when `draft` is 0)."""
    return SimScheduler(
        max_running=cap,
        max_total_tokens=pool,
        pace=pace,
        spec_draft_tokens=draft,
        accept_length=accept,
        crash_after=None,
        hybrid=False,
        mamba_cache_size=0,
    )


def test_a_full_pool_retracts_as_sglang_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    line = Roofline(bandwidth=1e12, weight_bytes=10**9, state_bytes=0, kv_bytes_per_token=10**4)
    sched = bare(line, cap=8, pool=2000)
    with caplog.at_level(logging.WARNING, logger="sglang.srt.managers.scheduler"):
        trace = simulate(sched, 8, prompt=100, lengths=[400])
    assert trace.peak_running > 2  # admitted on the reserve's estimate, more than the pool holds at the end
    retracted = "KV cache pool is full. Retract requests. #retracted_reqs: "
    assert any(r.message.startswith(retracted) for r in caplog.records)
    assert sum(sched.counters.generation_tokens.values()) == 8 * 400


def test_a_fractional_accept_length_is_kept_on_average() -> None:
    """2.5 accepted per step: 250 tokens take 100 steps of 0.1 s (2, 3, 2, 3, ...), not 125."""
    sched = bare(FixedPace(10.0), cap=1, pool=10**6, draft=4, accept=2.5)
    trace = simulate(sched, 1, prompt=10, lengths=[250])
    assert trace.seconds == pytest.approx(100 * 0.1)


def test_fixed_pace_ignores_the_batch() -> None:
    pace = FixedPace(50.0)
    assert pace.decode_seconds(1, 10) == pace.decode_seconds(500, 10**6) == 0.02
    assert FixedPace(0).decode_seconds(3, 30) == 0.0 and FixedPace(0).is_instant


@pytest.mark.parametrize(
    ("env", "configured", "expected"),
    [
        (None, 2.6, 2.6),
        ("3.0", 2.6, 3.0),
        ("-1", 2.6, 2.6),
        ("0", 2.2, 2.2),
        ("9", 2.6, 4.0),
        ("0.5", 2.6, 1.0),
    ],
)
def test_forced_acceptance_overrides_the_knob_within_sglangs_bounds(
    env: str | None, configured: float, expected: float
) -> None:
    assert forced_accept_length(env, configured, max_len=4) == expected


def test_forced_acceptance_commits_its_length_every_step() -> None:
    _, sched = launch(*ROOFLINE, *NO_RADIX, "--max-running-requests", "8", *MTP, acc_len_env="3.0")
    simulate(sched, 8, prompt=16, lengths=[301])
    counters = sched.counters
    # per request: 1 token from prefill, then 100 steps of 3
    assert counters.spec_verify_steps == pytest.approx(8 * 100)
    assert counters.spec_accept_tokens / counters.spec_forward_ct == pytest.approx(3.0)
    line = sched.decode_log_line()
    assert line is not None and "accept len: 3.00" in line
    assert sched.avg_spec_accept_length == 3.0
