"""`tune.verdict`: the winner per class by decode tok/s per GPU, the job's time at the measured rates."""

from __future__ import annotations

import math

import pytest

from fleetgen.tune.classes import GpuClass
from fleetgen.tune.verdict import finish_time, ratio, winner
from tests.unit.tune._helpers import measured, setting

# --- verdicts and the job's time ---------------------------------------------------------------------------


def test_the_winner_is_the_fastest_per_gpu_and_errors_never_win() -> None:
    base, big = setting("as-written", 44), setting("no-radix-256", 256)
    results = [measured(base, 1460.0), measured(big, 3008.0), measured(setting("x", 9), None, error="OOM")]
    assert winner(results) is results[1]
    assert ratio(results[1], results[0]) == pytest.approx(3008 / 1460)
    assert ratio(results[2], results[0]) is None


def test_a_tp2_instances_rate_is_per_gpu() -> None:
    tp2 = GpuClass(96, 2)
    m = measured(setting("a", 10), 2000.0, tp2)
    assert m.decode_tps_per_gpu == 1000.0


def test_the_jobs_time_is_its_tokens_over_the_fleets_summed_rate() -> None:
    small, big = GpuClass(96, 1), GpuClass(179, 1)
    f = finish_time(902_087, 1818.0, {small: 4, big: 7}, {small: 1500.0, big: 3000.0})
    assert f.tokens_per_s == 4 * 1500 + 7 * 3000
    assert f.seconds == pytest.approx(902_087 * 1818 / 27_000)
    assert f.text() == "902,087 completions × 1,818 tokens: 16.9 h on 4 × 96 GiB + 7 × 179 GiB"
    assert math.isinf(finish_time(10, 1.0, {small: 1}, {}).seconds)
