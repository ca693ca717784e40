"""What to measure next (pure): rounds under a time budget, and narrowing in around the best.

A round runs one candidate per instance of a GPU class at once; every round of a class takes about as long
as the first (launch, warm-up, window, stop), so once one has run, a round that would end past the budget
is not started. After the plan's candidates, rounds narrow in on the best one's running requests: halfway
to the nearest measured neighbour of its family (same flags but the running requests), or a quarter out
where it has none on that side.

A setting is resized by the engine's own flags (`Planner.concurrency`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fleetgen.plan.instance import size
from fleetgen.plan.job import JobShape
from fleetgen.plan.throughput import job_running, used_share
from fleetgen.plan.types import Ask, Planner, Setting

MIN_STEP = 0.08  # narrowing stops when the next step is below this share of the running requests


@dataclass(frozen=True)
class Budget:
    """The time a tune may take (seconds) and what it has used; `round_s`: the longest round so far (None
    before the first)."""

    total_s: float
    used_s: float = 0.0
    round_s: float | None = None

    @property
    def left_s(self) -> float:
        return self.total_s - self.used_s

    def can_start_round(self) -> bool:
        """The first round always runs (the baseline must be measured); later ones only if they would end
        within the budget at the longest round's pace."""
        return self.round_s is None or self.round_s <= self.left_s

    def after_round(self, took_s: float) -> Budget:
        longest = max(self.round_s or 0.0, took_s)
        return Budget(self.total_s, self.used_s + took_s, longest)


def next_round(pending: Sequence[Setting], slots: int, budget: Budget) -> list[Setting]:
    """The candidates of the next round: the first `slots` pending ones (one per instance), none when the
    budget cannot take another round."""
    if slots < 1 or not budget.can_start_round():
        return []
    return list(pending[:slots])


Family = Callable[[Setting], Any]


def family_key(resized_keys: Sequence[str]) -> Family:
    """A setting's family: its flags and env but the ones that size it for its running requests
    (`resized_keys`) and any flag set to that number (a CUDA-graph batch sized to it)."""

    def key(s: Setting) -> Any:
        args = {k: v for k, v in s.args.items() if k not in resized_keys and v != s.running}
        return (tuple(sorted((k, repr(v)) for k, v in args.items())), tuple(sorted(s.env.items())))

    return key


def narrow(
    best: Setting,
    tried: Sequence[Setting],
    family: Family,
    resize: Callable[[Setting, int], Setting | None],
) -> list[Setting]:
    """The running requests to try next around `best` (a measured winner): halfway to its nearest measured
    neighbour of the same family on each side, or a quarter out where there is none; each built by
    `resize` (None: it does not fit), none closer than MIN_STEP to a tried one."""
    n = best.running
    if n < 2:
        return []
    mine = family(best)
    tried_n = sorted({s.running for s in tried if family(s) == mine})
    below = [m for m in tried_n if m < n]
    above = [m for m in tried_n if m > n]
    wanted = [(below[-1] + n) // 2 if below else n * 3 // 4, (above[0] + n + 1) // 2 if above else n * 5 // 4]
    out: list[Setting] = []
    for m in dict.fromkeys(wanted):
        if m < 1 or any(abs(m - t) < MIN_STEP * n for t in tried_n):
            continue
        made = resize(best, m)
        if made is not None and made.running not in tried_n:
            out.append(made)
    return out


def resizer(planner: Planner, ask: Ask, job: JobShape) -> Callable[[Setting, int], Setting | None]:
    """`resize` for `narrow`: a setting sized for n running requests by the engine's own flags for n
    (`Planner.concurrency`) over its flags, any flag that was set to its running requests (a CUDA-graph
    batch) set to n; planned as `plan` plans it (None where it does not fit)."""

    def resize(best: Setting, n: int) -> Setting | None:
        mine = replace(ask, args=dict(best.args), env=dict(best.env))
        args = {k: (n if v == best.running and not isinstance(v, bool) else v) for k, v in best.args.items()}
        args |= planner.concurrency(mine, size(planner, mine), n)
        trial = replace(mine, args=args)
        sized = size(planner, trial)
        if not sized.fits:
            return None
        running, bound = job_running(planner, trial, sized, job)
        return Setting(
            f"{best.name.split('@')[0]}@{n}",
            ", ".join(filter(None, [best.change.split(" @ ")[0], f"@ {n} running"])),
            args,
            dict(best.env),
            running,
            bound,
            sized.memory.kv_tokens,
            is_spec=best.is_spec,
            numerics=best.numerics,
            used_share=used_share(sized.memory, running, job),
        )

    return resize
