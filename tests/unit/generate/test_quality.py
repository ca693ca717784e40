"""`generate.quality`: the quality flags (truncated, empty, think markers, repetition)."""

from __future__ import annotations

from fleetgen.generate.quality import flags_of, has_think_marker, is_repetitive
from fleetgen.http.client import Completion


def test_quality_flags() -> None:
    loop = "I think the answer is maybe " * 80
    assert is_repetitive(loop) and is_repetitive("好" * 3000)
    prose = " ".join(f"word{i} said something new about item {i * 7 % 13}" for i in range(200))
    assert not is_repetitive(prose) and not is_repetitive("short")
    flags = flags_of(Completion("<think>x</think> ans", "", "length", 1, 1))
    assert flags.is_truncated and flags.has_leaked_think and not flags.is_empty
    assert flags_of(Completion("  ", "r", "stop", 1, 1)).is_empty and has_think_marker("a</THINK>")
