"""The tests' port picker (`tests/fixtures/ports.py`): spans free when handed out, never overlapping within a
process, each xdist worker starting in its own slice below the kernel's ephemeral range, and never a port
another process on this machine (another worker, another test run) has claimed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures import ports

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, socket.socket]]:
    """This process's picker as a new process starts it; the claims it makes are released after the test."""
    claims: dict[int, socket.socket] = {}
    monkeypatch.setattr(ports, "_next", [-1])
    monkeypatch.setattr(ports, "_claims", claims)
    yield claims
    for sock in claims.values():
        sock.close()


def test_spans_are_free_disjoint_and_from_this_workers_slice(
    monkeypatch: pytest.MonkeyPatch, fresh: dict[int, socket.socket]
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    spans = [(ports.free_port(span), span) for span in (8, 102, 1, 8, 5)]
    low = ports.LOW + 3 * ports.SLICE // ports.BLOCK * ports.BLOCK
    taken: set[int] = set()
    for base, span in spans:
        block = set(range(base, base + span))
        assert all(low <= p < ports.HIGH and ports.is_free(p) for p in block)
        assert not block & taken
        taken |= block
    assert max(taken) < 32_768  # below the ephemeral range


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch, fresh: dict[int, socket.socket]) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    first = ports.LOW + ports.SLICE // ports.BLOCK * ports.BLOCK
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first + 2))
        busy.listen()
        base = ports.free_port(4)
    assert first + 2 not in range(base, base + 4) and base > first  # the busy one skipped, not reused


def test_no_port_of_ray_clients_own_range_is_handed_out(
    monkeypatch: pytest.MonkeyPatch, fresh: dict[int, socket.socket]
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")  # its slice starts at 23000: Ray Client's first port
    assert ports.LOW + 2 * ports.SLICE in ports.RAY_CLIENT_PORTS
    bases = [ports.free_port(span) for span in (8, 102, 1)]
    assert all(b >= ports.RAY_CLIENT_PORTS.stop for b in bases)


def test_workers_start_in_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = []
    for k in range(8):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{k}")
        starts.append(ports.LOW + ports.worker_index() * ports.SLICE)
    assert len(set(starts)) == 8 and max(starts) + ports.SLICE <= ports.HIGH


def test_a_port_another_run_claimed_is_never_handed_out(
    monkeypatch: pytest.MonkeyPatch, fresh: dict[int, socket.socket]
) -> None:
    """Two test runs on one machine, both `gw2` (the same slice): the second never gets a port of the
    first's spans, though nothing listens on them yet (the first's servers are still starting); once the
    first run is gone, its ports are free to claim again."""
    code = (
        "import sys; from tests.fixtures import ports; "
        "print(*[ports.free_port(s) for s in (16, 1, 8)], flush=True); sys.stdin.read()"
    )
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw2", "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    ) as other:
        assert other.stdout is not None and other.stdin is not None
        theirs_bases = [int(b) for b in other.stdout.readline().split()]
        theirs = {p for b, s in zip(theirs_bases, (16, 1, 8), strict=True) for p in range(b, b + s)}
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
        mine = {p for span in (8, 16, 3, 8) for b in [ports.free_port(span)] for p in range(b, b + span)}
        assert not mine & theirs, sorted(mine & theirs)
        other.stdin.close()
    assert other.wait() == 0
    assert ports.claim(min(theirs))  # the kernel freed its claims with it


@settings(max_examples=25, deadline=None)
@given(worker=st.integers(0, 20), spans=st.lists(st.integers(1, ports.SLICE // 4), min_size=1, max_size=6))
def test_every_span_lies_in_blocks_this_process_claimed(worker: int, spans: list[int]) -> None:
    """Whatever the worker and spans: a span starts on a block (so two processes' blocks are the same
    ports, whatever slice each started in) and every port of it is in a block this process holds."""
    saved = ports._next[:], dict(ports._claims)
    old_worker = os.environ.get("PYTEST_XDIST_WORKER")
    ports._next[0], ports._claims = -1, {}
    os.environ["PYTEST_XDIST_WORKER"] = f"gw{worker}"
    try:
        for span in spans:
            base = ports.free_port(span)
            assert (base - ports.LOW) % ports.BLOCK == 0 and base >= ports.LOW and base + span <= ports.HIGH
            assert all((p - (p - ports.LOW) % ports.BLOCK) in ports._claims for p in range(base, base + span))
            assert not set(range(base, base + span)) & set(ports.RAY_CLIENT_PORTS)  # Ray Client's own
    finally:
        for sock in ports._claims.values():
            sock.close()
        ports._next[:], ports._claims = saved
        if old_worker is None:
            os.environ.pop("PYTEST_XDIST_WORKER", None)
        else:
            os.environ["PYTEST_XDIST_WORKER"] = old_worker
