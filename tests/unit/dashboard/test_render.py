"""`dashboard.render`: the fleet table's sick and starved rows, the progress bar."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetgen.dashboard import render
from fleetgen.dashboard.model import InstanceRow
from fleetgen.deploy.readiness import Readiness
from tests.unit.dashboard._helpers import job_with


def test_sick_rows_are_marked_with_their_reason() -> None:
    rows = [
        InstanceRow("h-0", "h", (0,), 30000, readiness=Readiness.READY, gen_tokens_per_s=900.0),
        InstanceRow("h-1", "h", (1,), 30001, readiness=Readiness.DOWN, problem="not running"),
    ]
    html = render.fleet_table(rows)
    sick = re.findall(r'<tr class="instance sick"[^>]*data-instance="([^"]+)"', html)
    assert sick == ["h-1"] and "not running" in html and "1 SICK" in html


def serving(running: int, queued: int, **over: Any) -> InstanceRow:
    """A ready instance's row with this load (and `over`)."""
    return InstanceRow(
        "h-0", "h", (0,), 30000, readiness=Readiness.READY, running=running, queued=queued, **over
    )


@pytest.mark.parametrize(
    ("running", "queued", "admitted", "is_starved"),
    [(10, 0, 256, True), (204, 0, 256, True), (205, 0, 256, False), (10, 3, 256, False), (0, 0, 256, False)],
)
def test_a_batch_the_job_does_not_keep_full_shows_as_starved(
    running: int, queued: int, admitted: int, is_starved: bool
) -> None:
    """Running under 80 % of what the engine admits with nothing waiting: a note on the row (the server is
    healthy: not red), running shown beside admitted; an idle server (no job) is not starved."""
    html = render.fleet_table([serving(running, queued, max_running_requests=admitted)])
    assert ("starved" in html) is is_starved and 'class="instance sick"' not in html
    assert f">{running} / {admitted}<" in html


@pytest.mark.parametrize(
    ("running", "queued", "kv", "is_starved"),
    [(140, 0, 0.47, True), (298, 0, 0.999, False), (140, 5, 0.47, False), (140, 0, None, False)],
)
def test_a_floor_is_starved_while_its_kv_pool_has_room_and_nothing_waits(
    running: int, queued: int, kv: float | None, is_starved: bool
) -> None:
    """vLLM without max-num-seqs runs past its figure (105 on the H200, 298 ran): its row shows the figure as
    a floor, and the batch is starved while its KV pool has room and nothing waits, not by the figure."""
    row = serving(running, queued, kv_usage=kv, max_running_requests=105, running_is_floor=True)
    html = render.fleet_table([row])
    assert ("starved" in html) is is_starved and f">{running} / ≥105<" in html


def test_unknown_total_draws_no_full_progress_bar() -> None:
    html = render.progress_bar(job_with([], total=None))
    assert 'class="ok"' not in html
