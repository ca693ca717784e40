"""`generate.progress`: the resume position moves only past fully committed lines; a rate predicts only once a
whole window has passed."""

from __future__ import annotations

import time

import pytest

from fleetgen.generate.progress import RATE_WINDOW_S, PositionTracker, RateMeter
from fleetgen.generate.source import Position


def test_position_moves_only_past_fully_committed_lines() -> None:
    tracker = PositionTracker(Position())
    tracker.open(1, 10, 2)
    tracker.open(2, 20, 0)  # already done: no rows owed
    tracker.open(3, 30, 1)
    tracker.paid(3)
    tracker.advance()
    assert tracker.position == Position()  # line 1 still owes rows
    tracker.paid(1)
    tracker.paid(1)
    tracker.advance()
    assert tracker.position == Position(3, 30)


def test_a_rate_predicts_only_once_a_whole_window_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a start the rate is of the first few answers: no ETA from it until a window has passed."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    meter = RateMeter()
    assert not meter.is_measured
    for second in range(int(RATE_WINDOW_S) + 1):
        now[0] = 100.0 + second
        rate = meter.add(second * 3)
        assert meter.is_measured == (second >= RATE_WINDOW_S), second
    assert rate == pytest.approx(3.0)
