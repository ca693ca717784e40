"""`generate.quality`: the quality flags (truncated, empty, think markers, repetition)."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.generate.quality import SCREEN_CHARS, compressed_size, flags_of, has_think_marker, is_repetitive
from fleetgen.http.client import Completion

# Text the screen sees: any characters (1 to 4 bytes of UTF-8), loops of them, long enough to fill a probe.
UNITS = st.text(min_size=1, max_size=40)


def test_quality_flags() -> None:
    loop = "I think the answer is maybe " * 80
    assert is_repetitive(loop) and is_repetitive("好" * 3000)
    prose = " ".join(f"word{i} said something new about item {i * 7 % 13}" for i in range(200))
    assert not is_repetitive(prose) and not is_repetitive("short")
    flags = flags_of(Completion("<think>x</think> ans", "", "length", 1, 1))
    assert flags.is_truncated and flags.has_leaked_think and not flags.is_empty
    assert flags_of(Completion("  ", "r", "stop", 1, 1)).is_empty and has_think_marker("a</THINK>")


@given(
    unit=UNITS, repeats=st.integers(1, 3000), gap=st.text(max_size=SCREEN_CHARS), noise=st.text(max_size=80)
)
def test_the_screens_measure_is_zlibs_own_for_any_probe(
    unit: str, repeats: int, gap: str, noise: str
) -> None:
    """The screen's smaller window changes nothing: for any probe it can be handed (2,048 characters of any
    script: up to 8 KiB), loops and repeats far apart alike, the compressed size is exactly zlib's with its
    default window."""
    for text in (noise + unit * repeats, unit + gap + unit, noise + gap + noise):
        probe = text[-SCREEN_CHARS:].encode()
        assert compressed_size(probe) == len(zlib.compress(probe, 1))
