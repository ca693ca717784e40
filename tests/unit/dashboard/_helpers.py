"""What the dashboard unit tests share: a job's samples at known rates, a `JobView` over them."""

from __future__ import annotations

from fleetgen.dashboard.model import JobView, Sample


def linear_samples(
    rates: dict[str, float], seconds: int, step: float = 5.0, offset: float = 0.0
) -> list[Sample]:
    """Cumulative counters growing at a constant rate per instance, sampled every `step` seconds."""
    return [
        Sample(
            ts=1000.0 + t * step + offset * k,
            instance=name,
            completions=int(rate * t * step),
            output_tokens=int(100 * rate * t * step),
            accept_len=2.5,
        )
        for k, (name, rate) in enumerate(rates.items())
        for t in range(int(seconds / step) + 1)
    ]


def job_with(samples: list[Sample], **fields: object) -> JobView:
    base: dict[str, object] = dict(
        out_dir="/data/job", total=1000, done=400, num_errors=3, num_truncated=2, samples=tuple(samples)
    )
    base.update(fields)
    return JobView(**base)  # type: ignore[arg-type]
