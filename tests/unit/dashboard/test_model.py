"""`dashboard.model`: rates and ETA from samples (the report's and the live page's arithmetic).

Once test_report.py ("the report's pure parts"), split by module: test_render.py, test_page.py.
"""

from __future__ import annotations

from fleetgen.dashboard.model import eta_seconds, rate_series
from tests.unit.dashboard._helpers import job_with, linear_samples


def test_rates_recover_each_instance_slope_and_their_sum() -> None:
    samples = linear_samples({"a-0": 2.0, "b-0": 0.4}, seconds=600, offset=1.3)  # whole counts per sample
    series = {s.name: s for s in rate_series(samples, "completions")}
    assert set(series) == {"a-0", "b-0", "total"} and series["total"].is_total
    middle = slice(3, -3)  # the edges of the window see only one instance's samples
    for name, rate in (("a-0", 2.0), ("b-0", 0.4), ("total", 2.4)):
        values = [y for _, y in series[name].points][middle]
        assert all(abs(v - rate) < 0.05 * rate for v in values), (name, values)


def test_eta_is_remaining_work_over_the_recent_rate() -> None:
    job = job_with(linear_samples({"a-0": 2.0}, seconds=600), total=1000, done=400, num_errors=0)
    eta = eta_seconds(job)
    assert eta is not None and abs(eta - 600 / 2.0) < 5
    assert eta_seconds(job_with([], total=None)) is None
