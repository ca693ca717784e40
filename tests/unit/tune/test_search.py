"""`tune.search`: rounds under a budget, narrowing in on the best's running requests (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.plan.types import Setting
from fleetgen.tune.search import Budget, family_key, narrow, next_round
from tests.unit.tune._helpers import setting

# --- rounds under a budget ---------------------------------------------------------------------------------


def test_the_first_round_always_runs_and_a_round_that_cannot_finish_never_starts() -> None:
    pending = [setting(f"c{i}", 10 * i + 10) for i in range(5)]
    budget = Budget(100.0)
    assert next_round(pending, 2, Budget(0.001)) == pending[:2]  # the baseline is always measured
    budget = budget.after_round(40.0)
    assert next_round(pending, 2, budget) == pending[:2]  # 40 s more ends at 80 ≤ 100
    budget = budget.after_round(30.0)  # 70 used; the longest round (40) would end at 110
    assert budget.left_s == 30.0 and next_round(pending, 2, budget) == []


@given(
    st.floats(1, 10_000),
    st.lists(st.floats(0.1, 5_000), min_size=1, max_size=30),
)
def test_rounds_started_under_the_budget_end_within_it_at_the_longest_rounds_pace(
    total: float, rounds: list[float]
) -> None:
    """Invariant: every round after the first starts only if the longest round so far fits what is left;
    so if no round runs longer than the longest before it, the tune ends within the budget."""
    budget, longest = Budget(total), 0.0
    for took in rounds:
        if not next_round([setting("c", 1)], 1, budget):
            break
        started_with = budget
        budget = budget.after_round(took)
        if started_with.round_s is not None and took <= longest:
            assert budget.used_s <= total + 1e-6
        longest = max(longest, took)


# --- narrowing ---------------------------------------------------------------------------------------------


def _resize(best: Setting, n: int) -> Setting | None:
    """Sizes up to 400 fit (a stand-in for the plan's arithmetic)."""
    if n > 400:
        return None
    args = {**best.args, "max-running-requests": n}
    return Setting(f"{best.name.split('@')[0]}@{n}", "", args, {}, n, "", 0)


FAMILY = family_key(["max-running-requests"])


def test_narrowing_goes_halfway_to_the_measured_neighbours_of_the_same_family() -> None:
    tried = [
        setting("a0", 64, **{"max-running-requests": 64, "disable-radix-cache": True}),
        setting("a", 128, **{"max-running-requests": 128, "disable-radix-cache": True}),
        setting("b", 256, **{"max-running-requests": 256, "disable-radix-cache": True}),
        setting("c", 384, **{"max-running-requests": 384, "disable-radix-cache": True}),
        setting("other", 300, **{"max-running-requests": 300}),  # another family: no neighbour
    ]
    assert [s.running for s in narrow(tried[2], tried, FAMILY, _resize)] == [192, 320]


def test_narrowing_steps_out_a_quarter_where_nothing_was_measured_and_stops_at_what_fits() -> None:
    best = setting("a", 320, **{"max-running-requests": 320})
    assert [s.running for s in narrow(best, [best], FAMILY, _resize)] == [240, 400]
    best = setting("a", 360, **{"max-running-requests": 360})
    assert [s.running for s in narrow(best, [best], FAMILY, _resize)] == [270]  # 450 does not fit


def test_narrowing_stops_when_the_step_is_small() -> None:
    tried = [setting(str(n), n, **{"max-running-requests": n}) for n in (100, 104, 108)]
    assert narrow(tried[1], tried, FAMILY, _resize) == []


def test_a_cuda_graph_batch_sized_to_the_running_requests_is_not_part_of_the_family() -> None:
    a = setting("a", 256, **{"max-running-requests": 256, "cuda-graph-max-bs-decode": 256})
    b = setting("b", 192, **{"max-running-requests": 192, "cuda-graph-max-bs-decode": 192})
    assert FAMILY(a) == FAMILY(b)
    other = setting("c", 256, **{"max-running-requests": 256, "cuda-graph-max-bs-decode": 512})
    assert FAMILY(a) != FAMILY(other)  # a graph batch of its own is the setting's own choice
