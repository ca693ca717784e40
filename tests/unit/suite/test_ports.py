"""The tests' port picker (`tests/fixtures/ports.py`): spans free when handed out, never overlapping within a
process until its slice wraps, each xdist worker in its own slice below the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from tests.fixtures import ports


def test_spans_are_free_disjoint_and_in_this_workers_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(ports, "_taken", [0])
    spans = [(ports.free_port(span), span) for span in (8, 102, 1, 8, 5)]
    low = ports.LOW + 3 * ports.SLICE
    taken: set[int] = set()
    for base, span in spans:
        block = set(range(base, base + span))
        assert all(low <= p < low + ports.SLICE and ports.is_free(p) for p in block)
        assert not block & taken
        taken |= block
    assert max(taken) < 32_768  # below the ephemeral range


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(ports, "_taken", [0])
    first = ports.LOW + ports.SLICE
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first + 2))
        busy.listen()
        base = ports.free_port(4)
    assert first + 2 not in range(base, base + 4) and base > first  # the busy one skipped, not reused


def test_workers_get_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = []
    for k in range(8):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{k}")
        starts.append(ports.LOW + ports.worker_index() * ports.SLICE)
    assert len(set(starts)) == 8 and max(starts) + ports.SLICE <= 32_000
