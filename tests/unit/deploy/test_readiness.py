"""`deploy.readiness.decide`, the one place readiness is decided, over the whole observation space.

Invariants, not examples: every field of `Seen` is drawn (a reader may fill any subset), and each test states
what must hold for every observation. The last group checks what the readers rely on when they stop looking
early (FleetView asks no health of a dead process, a job asks no health while the fleet says not ready): the
fields they leave unobserved cannot change the judgement.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.deploy.readiness import Judgement, Readiness, Seen, decide

WHY = st.sampled_from(["", "why"])
READINESS = st.sampled_from(list(Readiness))
JUDGEMENT = st.builds(Judgement, READINESS, WHY)

SEEN = st.builds(
    Seen,
    fatal=WHY,
    is_alive=st.sampled_from([None, True, False]),
    gone=WHY,
    unseen=WHY,
    is_healthy=st.sampled_from([None, True, False]),
    stranger=WHY,
    engine_problem=WHY,
    drift=st.sampled_from([(), ("argv differs",)]),
    fleet=st.none() | JUDGEMENT,
    lost=WHY,
    silent=WHY,
    counted=st.booleans(),
    failing=WHY,
    was=st.none() | READINESS,
)


def fleet_says_ready(seen: Seen) -> bool:
    return seen.fleet is None or seen.fleet.readiness is Readiness.READY


@given(SEEN)
def test_ready_says_no_why_and_every_other_judgement_says_one(seen: Seen) -> None:
    readiness, why = decide(seen)
    assert (why == "") is (readiness is Readiness.READY), (seen, why)


@given(SEEN)
def test_a_dead_process_a_fatal_line_a_lost_endpoint_a_failed_probe_or_a_fleet_down_is_down(
    seen: Seen,
) -> None:
    is_down = (
        seen.is_alive is False
        or bool(seen.fatal)
        or bool(seen.lost)
        or bool(seen.failing)
        or (seen.fleet is not None and seen.fleet.readiness is Readiness.DOWN)
    )
    if is_down:
        assert decide(seen).readiness is Readiness.DOWN


@given(SEEN)
def test_ready_only_with_health_answering_and_nothing_against_it(seen: Seen) -> None:
    if decide(seen).readiness is Readiness.READY:
        assert seen.is_healthy is True and fleet_says_ready(seen)
        assert not (seen.fatal or seen.lost or seen.failing or seen.unseen or seen.is_alive is False)
        assert not (seen.silent and seen.counted)  # no progress by its engine's counters: health or not
        if seen.is_alive:  # a fleet's instance: its port, its engine's own state and its argv agree
            assert not (seen.stranger or seen.engine_problem or seen.drift)


@given(SEEN)
def test_an_instance_alive_healthy_with_its_engine_read_is_ready_unless_the_job_drains_it(seen: Seen) -> None:
    """Alive, health 200, its engine's state read, no stranger, no drift, nothing the fleet or job holds
    against it: READY, whatever it was before (a job's endpoint comes back)."""
    seen = replace(seen, is_alive=True, is_healthy=True, fatal="", unseen="", stranger="", engine_problem="")
    seen = replace(seen, drift=(), silent="")
    readiness = decide(seen).readiness
    if not (seen.lost or seen.failing) and fleet_says_ready(seen):
        assert readiness is Readiness.READY
    else:
        assert readiness is not Readiness.READY


@given(SEEN, st.booleans())
def test_a_live_process_is_down_only_when_dead_inside_lost_hung_or_the_fleet_says_so(
    seen: Seen, is_vouched: bool
) -> None:
    """A process seen running (by /proc, or by the fleet a job re-reads) that does not answer yet (loading)
    waits: DOWN asks for a restart, which would kill a loading engine."""
    if is_vouched:
        seen = replace(seen, is_alive=None, fleet=Judgement(Readiness.READY))
    else:
        seen = replace(seen, is_alive=True)
    is_hung = bool(seen.silent) and (seen.counted or seen.is_healthy is not True)
    fleet_down = seen.fleet is not None and seen.fleet.readiness is Readiness.DOWN
    failed = seen.fatal or seen.lost or seen.failing
    if not (failed or is_hung or fleet_down or seen.was is Readiness.DOWN):
        assert decide(seen).readiness is not Readiness.DOWN


@given(SEEN)
def test_a_job_endpoint_once_down_stays_down_until_ready(seen: Seen) -> None:
    assert decide(replace(seen, was=Readiness.DOWN)).readiness is not Readiness.WAITING


@given(SEEN)
def test_requests_in_flight_silent_with_health_failing_is_hung(seen: Seen) -> None:
    seen = replace(seen, silent="no answer for 60 s", is_healthy=False)
    readiness, why = decide(seen)
    assert readiness is not Readiness.READY
    if not (seen.fatal or seen.is_alive is False or seen.lost or seen.failing or seen.unseen or seen.fleet):
        assert readiness is Readiness.DOWN and "hung" in why


@given(SEEN, st.sampled_from([None, True, False]))
def test_no_progress_by_its_engine_s_counters_is_hung_whatever_health_says(
    seen: Seen, is_healthy: bool | None
) -> None:
    """SGLang answers /health 200 while its scheduler generates nothing (sgl-project/sglang#30314): where the
    engine's own samples are read, requests in flight with none of them moving is a hang, health or not."""
    job = Seen(silent="no progress for 60 s", counted=True, is_healthy=is_healthy, was=Readiness.READY)
    assert decide(job).readiness is Readiness.DOWN  # nothing else seen: a job's endpoint, health or not
    seen = replace(seen, silent="no progress for 60 s", counted=True, is_healthy=is_healthy)
    readiness, why = decide(seen)
    assert readiness is not Readiness.READY
    if not (seen.fatal or seen.is_alive is False or seen.lost or seen.failing or seen.unseen or seen.fleet):
        assert readiness is Readiness.DOWN and "hung" in why and "no progress for 60 s" in why


@given(SEEN)
def test_a_bare_url_is_judged_by_its_health_alone(seen: Seen) -> None:
    """No process to see, no fleet, nothing the job saw: health 200 is READY whatever its engine's state or
    port say (those are a fleet instance's conditions), and no answer is DOWN."""
    bare = replace(
        seen, fatal="", is_alive=None, unseen="", fleet=None, lost="", silent="", failing="", was=None
    )
    expected = Readiness.READY if bare.is_healthy is True else Readiness.DOWN
    assert decide(bare).readiness is expected


@given(
    SEEN,
    st.sampled_from(["fatal", "lost", "unseen", "stranger", "engine_problem", "silent", "failing"]),
)
def test_more_evidence_against_never_makes_it_ready(seen: Seen, evidence: str) -> None:
    if decide(seen).readiness is not Readiness.READY:
        more: dict[str, Any] = {evidence: "why"}
        assert decide(replace(seen, **more)).readiness is not Readiness.READY
        assert decide(replace(seen, is_alive=False)).readiness is not Readiness.READY
        if seen.is_healthy is True:
            assert decide(replace(seen, is_healthy=False)).readiness is not Readiness.READY


# What the readers leave unobserved once the judgement is settled cannot change it.


@given(SEEN, SEEN)
def test_a_dead_process_needs_no_further_look(seen: Seen, other: Seen) -> None:
    """FleetView and up's watch stop at a dead process (or a fatal line): health, port, engine, drift
    unread."""
    dead = replace(seen, is_alive=False)
    assert decide(dead) == decide(_later_reads_from(dead, other))
    fatal = replace(seen, fatal="Traceback")
    assert decide(fatal) == decide(_later_reads_from(fatal, other))


@given(SEEN, SEEN)
def test_a_live_process_failing_health_needs_no_further_look(seen: Seen, other: Seen) -> None:
    """FleetView stops at a failing health check: the port's owner, the engine's state and drift unread."""
    unhealthy = replace(seen, is_alive=True, is_healthy=False)
    after = replace(
        unhealthy, stranger=other.stranger, engine_problem=other.engine_problem, drift=other.drift
    )
    assert decide(unhealthy) == decide(after)


@given(SEEN, SEEN)
def test_a_stranger_on_the_port_needs_no_engine_read(seen: Seen, other: Seen) -> None:
    stranger = replace(seen, is_alive=True, is_healthy=True, stranger="pid 7 holds it")
    assert decide(stranger) == decide(replace(stranger, engine_problem=other.engine_problem))


@given(SEEN, st.sampled_from([None, True, False]))
def test_a_job_asks_no_health_while_the_fleet_says_not_ready(seen: Seen, is_healthy: bool | None) -> None:
    if not fleet_says_ready(seen):
        assert decide(seen) == decide(replace(seen, is_healthy=is_healthy))


def _later_reads_from(seen: Seen, other: Seen) -> Seen:
    return replace(
        seen,
        is_healthy=other.is_healthy,
        stranger=other.stranger,
        engine_problem=other.engine_problem,
        drift=other.drift,
        silent=other.silent,
        counted=other.counted,
        failing=other.failing,
    )
