"""`generate.choose.LeastLoaded`: whatever the endpoints do (requests sent and answered, drained and back,
caps raised), its pick is the scan of every endpoint the dispatcher made before: the READY one with room and
the fewest in flight, the first in order on a tie; None when none has room."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.deploy.readiness import Readiness
from fleetgen.generate.choose import LeastLoaded
from fleetgen.generate.health import Endpoint
from fleetgen.http.client import EngineClient


def scan(endpoints: list[Endpoint]) -> Endpoint | None:
    """The dispatcher's pick before `LeastLoaded`: every endpoint looked at."""
    best: Endpoint | None = None
    for e in endpoints:
        has_room = e.readiness is Readiness.READY and e.in_flight < e.cap
        if has_room and (best is None or e.in_flight < best.in_flight):
            best = e
    return best


STEPS = st.lists(
    st.tuples(st.sampled_from(["send", "answer", "drain", "ready", "raise_cap"]), st.integers(0, 7)),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(caps=st.lists(st.integers(1, 4), min_size=1, max_size=8), steps=STEPS)
def test_the_pick_is_the_scan_of_every_endpoint(caps: list[int], steps: list[tuple[str, int]]) -> None:
    client = EngineClient("http://127.0.0.1:9")
    endpoints = [Endpoint(f"s{i}", client, cap) for i, cap in enumerate(caps)]
    chooser = LeastLoaded(endpoints)
    for step, which in steps:
        assert chooser.pick() is scan(endpoints)
        e = endpoints[which % len(endpoints)]
        if step == "send" and (picked := chooser.pick()) is not None:  # as the dispatcher launches
            picked.in_flight += 1
            chooser.moved(picked)
        elif step == "answer" and e.in_flight:
            e.in_flight -= 1
            chooser.moved(e)
        elif step == "drain":  # lost: not told one by one (its entries go stale)
            e.readiness = Readiness.DOWN
        elif step == "ready" and e.readiness is not Readiness.READY:
            e.readiness = Readiness.READY
            chooser.rebuild()  # the monitor's on_ready
        elif step == "raise_cap":
            e.cap += 1
            chooser.moved(e)
    assert chooser.pick() is scan(endpoints)
