"""When a candidate's batch is ready to be measured (pure): the warm-up's verdict from the engine's own
running and queued requests, sampled over time.

Full: the running requests reach `FILLED` of what the engine admits. Held: fewer run, requests wait in the
engine's queue, and the running count's peak has not risen for `HELD_S`: the engine holds the batch at a bound
of its own (its KV admission, say) and a window now measures what it really does, with a note. Anything else
at the warm-up's cap is no steady rate: nothing running yet (a first-use compile can stall a scheduler for
a minute and more), or a batch still filling. Those are errors, never ranked: a window over a batch that
is filling reads a fraction of the engine's rate (seen on the H200: 682 tok/s where the filled batch ran
3,390, `bench/results/raw/tune-sglang-0.5.15-h200/README.md`). A window read over a batch the engine held
at less than half of what it admits (`held_below`) is an error too, in the engine's terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FILLED = 0.95  # of the admitted running requests
FAR_BELOW = (
    0.5  # a window whose mean running is below this share of the admitted, with requests queued: no rate
)
HELD_S = 10.0  # running requests that have not risen for this long, with requests queued: the engine's bound
HELD_JITTER = 0.02  # a rise this small (at least one request) is a finished request replaced, not filling


@dataclass(frozen=True)
class Sample:
    """The engine's running and queued requests at `at` (monotonic seconds)."""

    at: float
    running: float
    queued: float


@dataclass(frozen=True)
class Fill:
    """The warm-up's verdict: `ready` to measure (with a `note` where the engine held the batch below what it
    admits), or `error` (no steady rate: the candidate is not ranked); neither: keep waiting."""

    ready: bool = False
    note: str = ""
    error: str = ""

    @property
    def waiting(self) -> bool:
        return not self.ready and not self.error


def fill_verdict(samples: Sequence[Sample], admitted: int, cap_s: float) -> Fill:
    """What the samples so far (oldest first, the first at the warm-up's start) say."""
    if not samples:
        return Fill()
    now = samples[-1]
    if now.running >= FILLED * admitted:
        return Fill(ready=True)
    if now.running > 0 and now.queued > 0 and _held(samples, now.at - HELD_S):
        return Fill(
            ready=True,
            note=f"the engine held {now.running:.0f} running of the {admitted} it admits with "
            f"{now.queued:.0f} queued: held by the engine (its KV admission, or a stall: the window tells)",
        )
    if now.at - samples[0].at < cap_s:
        return Fill()
    if now.running <= 0:
        return Fill(
            error=f"no request was running after the {cap_s:.0f} s warm-up (a first-use compile or a "
            "stalled scheduler; the engine's log says which): no steady rate; give --warmup more"
        )
    return Fill(
        error=f"the batch was still filling after the {cap_s:.0f} s warm-up ({now.running:.0f} of "
        f"{admitted} running): no steady rate; give --warmup more"
    )


def held_below(
    peak_running: float | None, queued: float, admitted: int, decode_tps: float | None = None
) -> str:
    """The error of a window over which the engine ran far below what it admits the whole time (its peak
    running under `FAR_BELOW` of it) with requests queued, in the engine's terms; "" for a window that
    measured the setting. The peak, not the mean: short requests churn below a small batch's bound between
    reads (vLLM-CPU at max-num-seqs 2: a mean of 0.9, a peak of 2). Such a rate is not the setting's: never
    ranked. Two causes, told apart by the engine's own decode counter:
    - it decoded (`decode_tps` > 0): its admission held the batch (SGLang reserves KV for a new request's
      whole clipped output and the running requests' remaining ones: `plan.sglang.admission`);
    - it decoded nothing: a stall, not a bound, however many ran. On the H100 the MTP candidate at 11 ran 1
      with 8 queued and no decode step (no accept length) for the whole window, on a pool SGLang's admission
      fills with 16 of the job's requests (its 18-request candidate at 0.92, on less KV per request, ran
      18); SGLang 0.5.17's MTP candidate at 36 (`--enable-linear-replayssm-spec`) held 24 with 22 queued, its
      scheduler silent after its fourth prefill batch: two thirds of what it admits, and still no rate."""
    if peak_running is None:
        return ""
    held = f"{peak_running:.0f} of {admitted} running, {queued:.0f} queued over the whole window"
    if decode_tps is not None and decode_tps <= 0 and (peak_running > 0 or queued > 0):
        return (
            f"stalled: {held} and not one token decoded (a first-use compile or a hung scheduler: the "
            "engine's log says which); no rate for this setting: measure it again with a longer --warmup"
        )
    if queued <= 0 or peak_running >= FAR_BELOW * admitted:
        return ""
    return (
        f"KV admission: {held} (the engine held the batch far below what it admits: its KV pool keeps "
        "room for the running requests' remaining outputs); no rate for this setting: a smaller "
        "max-running-requests, or more KV per request"
    )


def _held(samples: Sequence[Sample], since: float) -> bool:
    """The samples reach back to `since` and the running requests' peak since then is not above their peak
    up to it (but by a finished request replaced): a batch at the engine's bound churns below its peak as
    requests end and queued ones take their place (vLLM-CPU's short requests: never two samples alike)."""
    if samples[0].at > since:
        return False
    before = max(s.running for s in samples if s.at <= since)
    recent = max(s.running for s in samples if s.at >= since)
    return recent <= before + max(1.0, HELD_JITTER * before)
