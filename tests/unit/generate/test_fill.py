"""Filling a server whose engine runs past its own figure (`dispatch.refilled`, `Dispatcher.fill`): vLLM
without max-num-seqs says its concurrency at max-model-len (105 on the H200) and runs what its blocks hold
(298 for the tune job). Pure arithmetic over an engine modelled by its true batch: running = min(sent,
batch), waiting = the rest, as SGLang's and vLLM's /metrics count them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.generate.dispatch import FILL_CEILING, FILL_STEP, QUEUE_EXTRA, in_flight_for, refilled


def engine(sent: int, batch: int) -> tuple[int, int]:
    """(running, waiting) of an engine that runs up to `batch` of the `sent` requests."""
    return min(sent, batch), max(sent - batch, 0)


@given(floor=st.integers(1, 2000), more=st.integers(0, 3000))
def test_a_floor_fills_to_the_batch_the_engine_runs_with_the_queue_beside_it(floor: int, more: int) -> None:
    """From the floor's in-flight, the cap rises while the engine runs everything, and stops with the queue
    `run` keeps beside a batch (in_flight_for(batch) − batch) waiting, within one step of it, in as many
    steps as a quarter a step takes from the floor; never past the ceiling."""
    batch = min(floor + more, FILL_CEILING)
    cap, steps = in_flight_for(floor), 0
    while (raised := refilled(cap, cap, *engine(cap, batch))) != cap:
        assert cap < raised <= in_flight_for(FILL_CEILING)
        cap, steps = raised, steps + 1
        assert steps <= 60
    running, waiting = engine(cap, batch)
    assert running == batch and waiting >= in_flight_for(batch) - batch
    assert cap <= max(in_flight_for(batch) * (1 + FILL_STEP) + 1, in_flight_for(batch) + QUEUE_EXTRA)


@given(batch=st.integers(1, FILL_CEILING))
def test_an_engine_that_runs_what_it_says_is_never_raised(batch: int) -> None:
    """SGLang's figure (or vLLM's with max-num-seqs) is its batch: at in_flight_for(it) the engine queues the
    rest, and the cap stays."""
    cap = in_flight_for(batch)
    assert refilled(cap, cap, *engine(cap, batch)) == cap


@given(cap=st.integers(1, 6000), short=st.integers(1, 100), running=st.integers(0, 6000))
def test_a_job_below_its_cap_is_not_raised(cap: int, short: int, running: int) -> None:
    """The input running out (fewer in flight than the cap) says nothing of the engine: no raise."""
    assert refilled(cap, max(cap - short, 0), min(running, cap - 1), 0) == cap
