"""The sim's whole-server faults (`sim/faults.py`): what each request meets, how long a fault lasts, the
control body refused in its words. The HTTP side, on a real sim process: tests/integration/sim/."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.sim.faults import (
    CONTROL_PATH,
    GENERATION_PATHS,
    HEALTH_PATHS,
    Action,
    Fault,
    FaultMode,
    parse_fault,
)

PATHS = sorted({CONTROL_PATH, *GENERATION_PATHS, *HEALTH_PATHS, "/server_info", "/metrics", "/v1/models"})
# What a generation request meets under each mode (every other path is served, except under hang).
ON_GENERATION = {
    FaultMode.OK: Action.SERVE,
    FaultMode.HTTP_500: Action.ANSWER_500,
    FaultMode.HTTP_503: Action.ANSWER_503,
    FaultMode.DROP: Action.DROP,
    FaultMode.HANG: Action.HOLD,
    FaultMode.STALL: Action.HOLD,
}


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0  # from 0: `now + seconds` is exact, so the end is exactly where the test says

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("mode", list(FaultMode))
@pytest.mark.parametrize("path", PATHS)
def test_each_request_meets_its_modes_action(mode: FaultMode, path: str) -> None:
    """The control is never faulted (a test can always lift a fault); generation requests meet the mode;
    health and info answer except under hang, which holds everything (stall: /health still 200)."""
    fault = Fault()
    fault.set(mode)
    action = fault.action(path)
    if path == CONTROL_PATH:
        assert action is Action.SERVE
    elif path in GENERATION_PATHS:
        assert action is ON_GENERATION[mode]
    else:
        assert action is (Action.HOLD if mode is FaultMode.HANG else Action.SERVE)


@given(st.sampled_from(list(FaultMode)), st.floats(0, 1e6), st.floats(0, 2e6))
def test_a_bounded_fault_holds_exactly_its_seconds_then_the_server_is_ok(
    mode: FaultMode, seconds: float, later: float
) -> None:
    clock = Clock()
    fault = Fault(clock=clock)
    fault.set(mode, seconds)
    clock.now += later
    is_on = later < seconds and mode is not FaultMode.OK
    assert fault.mode is (mode if is_on else FaultMode.OK)
    left = fault.seconds_left
    assert left == (pytest.approx(seconds - later) if is_on else None)


def test_an_unbounded_fault_lasts_until_changed() -> None:
    clock = Clock()
    fault = Fault(clock=clock)
    fault.set(FaultMode.DROP)
    clock.now += 1e9
    assert (fault.mode, fault.seconds_left) == (FaultMode.DROP, None)
    fault.set(FaultMode.OK, 5)  # ok takes no end: nothing comes back after it
    clock.now += 10
    assert fault.mode is FaultMode.OK and fault.seconds_left is None


@pytest.mark.parametrize("mode", [FaultMode.HANG, FaultMode.STALL])
async def test_a_held_request_is_released_when_the_fault_changes(mode: FaultMode) -> None:
    fault = Fault()
    fault.set(mode)
    path = next(iter(GENERATION_PATHS))
    held = asyncio.create_task(fault.held(path))
    await asyncio.sleep(0)
    assert not held.done()
    fault.set(FaultMode.HANG if mode is FaultMode.STALL else FaultMode.STALL)  # still held: still waits
    await asyncio.sleep(0)
    assert not held.done()
    fault.set(FaultMode.HTTP_503)
    await asyncio.wait_for(held, 10)


async def test_a_held_request_is_released_when_the_faults_seconds_run_out() -> None:
    fault = Fault()
    fault.set(FaultMode.HANG, 0.01)
    await asyncio.wait_for(fault.held("/health"), 10)
    assert fault.mode is FaultMode.OK


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "expected a JSON object"),
        ("hang", "expected a JSON object"),
        ({}, "mode must be one of ok, http_500, http_503, drop, hang, stall, got None"),
        ({"mode": "HANG"}, "got 'HANG'"),
        ({"mode": 500}, "got 500"),
        ({"mode": "hang", "seconds": "5"}, "seconds must be a number or null, got '5'"),
        ({"mode": "hang", "seconds": True}, "seconds must be a number or null, got True"),
        ({"mode": "hang", "seconds": -1}, "seconds must be >= 0 or null, got -1"),
        ({"mode": "hang", "for": 5}, "unknown field(s) ['for']"),
    ],
)
def test_a_bad_control_body_is_refused_naming_what_is_wrong(body: Any, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_fault(body)
    assert says in str(caught.value)


@given(st.sampled_from(list(FaultMode)), st.none() | st.integers(0, 10**6) | st.floats(0, 1e6))
def test_every_good_control_body_is_read_as_given(mode: FaultMode, seconds: float | None) -> None:
    assert parse_fault({"mode": mode.value, "seconds": seconds}) == (
        mode,
        None if seconds is None else float(seconds),
    )
