"""`generate.progress`: the resume position moves only past fully committed lines."""

from __future__ import annotations

from fleetgen.generate.progress import PositionTracker
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
