"""What was measured, and what it says (pure): the winner per GPU class, each candidate's ratio to the
fleet file's own settings, and the time the whole job would take on the whole fleet at the measured rates.

The figure that decides is the engine's decode rate per GPU over a steady window (`Engine.decode_rate`):
output tokens are what the job buys. Completions/s (the dispatcher's count over the same window) are shown
beside it; with the job's own output lengths they tell the same story, more noisily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetgen.plan.types import Setting
from fleetgen.tune.classes import GpuClass

BASELINE = (
    "as-written"  # the fleet file's own settings, always measured (`plan.throughput.plan_job` names it)
)


@dataclass(frozen=True)
class Measured:
    """One candidate measured on one instance of a class, over a steady window (or why not)."""

    gpu_class: GpuClass
    setting: Setting
    instance: str
    at: str  # when the window ended (ISO 8601, UTC)
    admitted: int | None = None  # the running requests the engine admits (its own view)
    running: float | None = None  # mean running requests over the window
    decode_tps: float | None = None  # the engine's decode rate over the window, whole instance
    completions_per_s: float = 0.0
    accept_length: float | None = None
    window_s: float = 0.0
    clients: int = 0  # requests kept in flight
    notes: tuple[str, ...] = ()
    error: str = ""  # it did not start, or died: the reason

    @property
    def decode_tps_per_gpu(self) -> float:
        return (self.decode_tps or 0.0) / self.gpu_class.tp

    @property
    def is_ok(self) -> bool:
        return not self.error and self.decode_tps is not None and self.decode_tps > 0


def baseline_of(results: Sequence[Measured]) -> Measured | None:
    return next((m for m in results if m.setting.name == BASELINE and m.is_ok), None)


def ratio(m: Measured, baseline: Measured | None) -> float | None:
    """Its decode rate per GPU over the fleet file's own settings' (None without both)."""
    if baseline is None or not m.is_ok:
        return None
    return m.decode_tps_per_gpu / baseline.decode_tps_per_gpu


def winner(results: Sequence[Measured]) -> Measured | None:
    """The highest decode rate per GPU among those measured without error; None when none was."""
    ok = [m for m in results if m.is_ok]
    return max(ok, key=lambda m: m.decode_tps_per_gpu, default=None)


@dataclass(frozen=True)
class FinishTime:
    """The whole job at the winners' rates: completions × tokens each over the fleet's summed decode rate."""

    completions: int
    tokens_per_completion: float
    tokens_per_s: float  # the whole fleet's
    fleet: tuple[tuple[int, str], ...]  # (instances, class name)

    @property
    def seconds(self) -> float:
        if self.tokens_per_s <= 0:
            return float("inf")
        return self.completions * self.tokens_per_completion / self.tokens_per_s

    def text(self) -> str:
        on = " + ".join(f"{n} × {name}" for n, name in self.fleet)
        return (
            f"{self.completions:,} completions × {self.tokens_per_completion:,.0f} tokens: "
            f"{duration(self.seconds)} on {on}"
        )


def finish_time(
    completions: int,
    tokens_per_completion: float,
    instances: Mapping[GpuClass, int],
    rates: Mapping[GpuClass, float],
) -> FinishTime:
    """The job's time on every instance of each class at that class's measured decode rate per instance
    (a class with no rate adds nothing)."""
    total = sum(n * rates.get(cls, 0.0) for cls, n in instances.items())
    fleet = tuple((n, cls.name) for cls, n in instances.items())
    return FinishTime(completions, tokens_per_completion, total, fleet)


def duration(seconds: float) -> str:
    """Seconds as a person reads a job's length: 45 s, 12.5 min, 3.4 h, 2.9 days."""
    if seconds == float("inf"):
        return "never (no measured rate)"
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size or (unit == "min" and seconds >= size):
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
