"""`deploy.readywait`: log lines split across reads, fatal signatures per engine, process states (pure)."""

from __future__ import annotations

from fleetgen.deploy.death import GENERIC_SIGNATURES, first_fatal
from fleetgen.deploy.readywait import LaunchLog, proc_state
from fleetgen.engines import get_engine


def test_launch_log_splits_partial_lines_and_fatal_is_engine_specific() -> None:
    w = LaunchLog("/l")
    assert w.feed(b"one\ntw") == ["one"]
    assert w.feed(b"o\nthree") == ["two"]
    assert w.offset == 13 and w.tail_text().splitlines() == ["one", "two", "three"]
    sglang = get_engine("sglang")
    oom = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.9"
    hit = first_fatal(["loading", oom], sglang.fatal_signatures)
    assert hit is not None and "memory" in hit[0].cause
    exec_fail = "/w/h0-0/launch.sh: line 5: /no/python: No such file or directory"
    hit2 = first_fatal([exec_fail], GENERIC_SIGNATURES)
    assert hit2 is not None and "engine.python" in hit2[0].fix


def test_proc_state_reads_zombies_and_pid_reuse() -> None:
    fields = ["S", *["0"] * 18, "777", "0"]
    line = "42 (py thon) " + " ".join(fields)
    assert proc_state(line, 777)
    assert not proc_state(line, 778)
    assert not proc_state(line.replace(" S ", " Z ", 1), 777)
    assert not proc_state("", 777)
