"""Why an engine died, in its own words (`deploy.death`), on the real log of one that did: SGLang 0.5.15 on an
H100 whose scheduler died of CUDA OOM under tune's load (tests/data/real-engines/sglang-0.5.15-h100-tune/).

Invariants: any tail of a dead engine's log that holds its last exception names that exception in the engine's
words, where it was raised and the fix for its cause; a log with no raised exception names no death (the
healthy part of the same log, with its warnings that mention errors, included).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.deploy.death import Death, death_of, last_frame, shortened, signatures_of
from fleetgen.engines import get_engine

OOM_LOG = Path(__file__).parents[2] / "data" / "real-engines" / "sglang-0.5.15-h100-tune" / "engine-oom.log"
LINES = OOM_LOG.read_text().splitlines()
SGLANG = get_engine("sglang")
HEALTHY = next(i for i, line in enumerate(LINES) if "Scheduler hit an exception" in line)
RAISED = next(i for i, line in enumerate(LINES) if line.startswith("torch.OutOfMemoryError"))


@pytest.mark.parametrize("num_lines", [len(LINES), 400, 200, len(LINES) - HEALTHY, len(LINES) - RAISED + 3])
@pytest.mark.parametrize("rule_set", ["sglang-0.5.15", "sglang-0.5.23", "no-such-release", ""])
def test_the_h100s_oom_is_said_in_the_engines_words_from_any_tail_that_holds_it(
    num_lines: int, rule_set: str
) -> None:
    died = death_of(LINES[-num_lines:], signatures_of(SGLANG, rule_set))
    assert died is not None
    assert died.cause == "GPU out of memory"
    assert died.words.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 202.00 MiB.")
    assert "1.38 MiB is free." in died.words
    assert "expandable_segments" not in died.words  # torch's allocator advice is not the engine's words
    assert "mem-fraction-static" in died.fix
    text = died.text()
    assert text.startswith("GPU out of memory: torch.OutOfMemoryError: CUDA out of memory.")
    if num_lines >= len(LINES) - HEALTHY:  # the traceback's frames are in the tail
        assert died.frame == "chunk_delta_h.py:324 in chunk_gated_delta_rule_fwd_h"
        assert text.endswith("(at chunk_delta_h.py:324 in chunk_gated_delta_rule_fwd_h)")


@pytest.mark.parametrize("end", [HEALTHY, HEALTHY - 1, 60, 12, 1, 0])
def test_a_log_that_raised_nothing_names_no_death(end: int) -> None:
    """The server's healthy lines ("No module named 'cuda.tile'" warnings, "Ignore import error …", "Failed to
    load generation config") are no death, at any length."""
    assert death_of(LINES[:end], signatures_of(SGLANG, "sglang-0.5.15")) is None


def test_an_unknown_exception_is_named_with_its_frame_and_the_log_as_the_fix() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/x/sglang/srt/managers/scheduler.py", line 10, in run',
        "    self.step()",
        '  File "/x/sglang/srt/managers/io.py", line 77, in step',
        "    raise KeyError(rid)",
        "KeyError: 'rid-1'",
        "[2026] kill_process_tree called: parent_pid=1",
    ]
    died = death_of(lines, signatures_of(SGLANG))
    assert died is not None
    assert died == Death("the engine raised KeyError", "KeyError: 'rid-1'", "io.py:77 in step", died.fix)
    assert "traceback" in died.fix


def test_the_frame_is_the_last_above_the_exception_not_one_of_a_later_traceback() -> None:
    lines = ['  File "/a/one.py", line 1, in f', "ValueError: x", '  File "/a/two.py", line 2, in g']
    assert last_frame(lines, "ValueError: x") == "one.py:1 in f"
    assert last_frame(["ValueError: x"], "ValueError: x") == ""


def test_long_words_are_cut_after_a_sentence_and_short_ones_kept() -> None:
    short = "RuntimeError: boom"
    assert shortened(short) == short
    long = "E: " + "a" * 150 + ". Then advice " + "b" * 300
    assert shortened(long) == "E: " + "a" * 150 + "."
    endless = "E: " + "c" * 1000
    assert shortened(endless) == endless[:200] + "…"
