"""What SGLang needs beyond its static pools (`plan.sglang.headroom`), checked against an H100 80GB's real
runs (SGLang 0.5.15, Qwen3.6-27B, the tune job; tests/data/real-engines/sglang-0.5.15-h100-tune/ and
../shared/data/real-engines/sglang-0.5.15-h100-tune/): 0.92 with the replayed SSM decode ran under load, 0.95
died of CUDA OOM in the GDN chunked prefill. Invariants: a fraction the plan refuses names the largest safe
one, and that one plans without the refusal; the replay rings are the engine's own allocation.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from fleetgen.plan.sglang.headroom import largest_safe_fraction, replay_ring_bytes
from fleetgen.plan.types import GIB
from tests.fixtures.planmodels import QWEN, plan_one

H100_GIB = 79.18  # "GPU 0 has a total capacity of 79.18 GiB" (the OOM line)
OOM_LOG = Path(__file__).parents[3] / "data" / "real-engines" / "sglang-0.5.15-h100-tune" / "engine-oom.log"
# tune's candidates on the H100, as they launched (the job's context 6,400)
NO_RADIX = {"context-length": 6400, "disable-radix-cache": True, "mamba-radix-cache-strategy": "no_buffer"}
REPLAY = {**NO_RADIX, "enable-linear-replayssm": True}


def h100(args: dict[str, object], mfs: float, running: int) -> list[str]:
    plan = plan_one(
        {**args, "mem-fraction-static": mfs, "max-running-requests": running},
        version="0.5.15",
        gpu_gib=H100_GIB,
    )
    return [e.rule for e in plan.errors]


def test_the_replay_ring_buffers_are_what_the_engine_allocated_for_88_slots() -> None:
    line = next(x for x in OOM_LOG.read_text().splitlines() if "ReplaySSM ring buffers allocated" in x)
    logged = sum(float(v) for v in re.findall(r"=(\d+\.\d+)GB", line)) * GIB  # its "GB" are GiB
    assert abs(replay_ring_bytes(QWEN, 1, 88) - logged) / logged < 0.01


def test_the_fractions_that_ran_under_load_on_the_h100_fit_and_the_one_that_died_is_refused() -> None:
    assert h100(REPLAY, 0.85, 58) == []
    assert h100(NO_RADIX, 0.92, 79) == []
    assert h100(REPLAY, 0.92, 79) == []  # ran: 2,014 decode tok/s at 78 running
    assert h100(REPLAY, 0.95, 88) == ["headroom"]  # died: "Tried to allocate 202.00 MiB … 1.38 MiB is free"


def test_the_refusal_names_the_figure_and_the_largest_safe_fraction_which_plans_clean() -> None:
    plan = plan_one(
        {**REPLAY, "mem-fraction-static": 0.95, "max-running-requests": 88},
        version="0.5.15",
        gpu_gib=H100_GIB,
    )
    [error] = plan.errors
    assert "leaves 3.9 GiB outside the static pools" in error.message
    assert "replayed-SSM ring buffers 2.1" in error.message and "CUDA OOM" in error.message
    safe = float(re.search(r"set mem-fraction-static (\d\.\d\d) or lower", error.fix).group(1))  # type: ignore[union-attr]
    assert 0.92 <= safe < 0.95
    assert h100(REPLAY, safe, 88) == []
    assert h100(REPLAY, round(safe + 0.01, 2), 88) == ["headroom"]


@given(free=st.integers(1, 200 * GIB), need=st.integers(0, 200 * GIB))
@example(free=99_999_436_618, need=1)  # a float's rounding gave 1.00 here
def test_the_largest_safe_fraction_leaves_the_need_and_a_hundredth_more_would_not(
    free: int, need: int
) -> None:
    f = largest_safe_fraction(free, need)
    assert (f == round(f, 2) and 0.0 <= f < 1.0) or (need == 0 and f == 1.0)
    if f > 0:
        assert free * (1 - f) >= need * (1 - 1e-9)
    if f + 0.01 < 1.0 and need < free:
        assert free * (1 - (f + 0.01)) < need * (1 + 1e-9)
