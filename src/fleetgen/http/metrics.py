"""An engine's numbers: its /metrics text → counters, gauges, load.

The text is parsed with prometheus_client's reference parser (pure); samples are summed over label sets
(per-position and per-DP-rank series add up to the engine-wide figure). SGLang exports gauges
(`sglang:gen_throughput`); vLLM only counters, so its throughput is the rate of `vllm:generation_tokens_total`
between two reads and its accept length (`Engine.accept_length`) is read over a window (`counter_deltas`):
the figure of the last seconds, of a bench level or of one test request.

A `Scrape` holds the samples and each sample name's labels. Load: running, queued, tok/s, KV use (an
info-JSON accept length asked of the engine). `window_of` reads a window of scrapes: the engine's own decode
rate, mean running, accept length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetgen.engines.base import Engine, Labels
from fleetgen.errors import EndpointError


@dataclass(frozen=True)
class Scrape:
    """One /metrics read, parsed once: samples (summed over labels), when (monotonic seconds), and each sample
    name's first label set (where an info-style metric carries figures, which `Engine.capacity` reads)."""

    at: float
    samples: dict[str, float]
    labels: Labels = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, at: float = 0.0) -> Scrape:
        """Prometheus text → a Scrape taken `at`."""
        totals: dict[str, float] = {}
        labels: dict[str, Mapping[str, str]] = {}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
                    labels.setdefault(sample.name, sample.labels)
        except ValueError as exc:
            fix = "check that the URL is an engine's (http://host:port) serving Prometheus text at /metrics"
            raise EndpointError(f"unparseable /metrics text: {exc}", fix=fix) from exc
        return cls(at, totals, labels)


@dataclass(frozen=True)
class Load:
    """What an engine is doing right now."""

    running: int | None
    queued: int | None
    gen_tokens_per_s: float | None
    spec_accept_length: float | None
    kv_usage: float | None = None  # the KV pool's used fraction, 0..1


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """`after`, with each counter (a `*_total` sample) replaced by its increase since `before` (the window's
    figure); a counter `before` lacks counts from zero, one that went down means the engine restarted: its
    new total. Gauges stay as read `after`."""
    return {
        name: value - before.get(name, 0.0)
        if name.endswith("_total") and value >= before.get(name, 0.0)
        else value
        for name, value in after.items()
    }


def counter_rate(name: str, now: Scrape, before: Scrape | None) -> float | None:
    """Per-second increase of a counter between two scrapes; None without two usable scrapes.

    A counter that went down means the engine restarted: the rate is unknown, not negative.
    """
    if before is None or name not in now.samples or name not in before.samples:
        return None
    elapsed = now.at - before.at
    delta = now.samples[name] - before.samples[name]
    if elapsed <= 0 or delta < 0:
        return None
    return delta / elapsed


def load_from(engine: Engine, now: Scrape, before: Scrape | None = None, info: Any = None) -> Load:
    """Running/queued/KV use from gauges; throughput from the gauge (SGLang) or the counter rate (vLLM)."""
    names = engine.metrics
    running = now.samples.get(names.running)
    queued = now.samples.get(names.queued)
    tps = now.samples.get(names.gen_throughput)
    if tps is None:
        tps = counter_rate(names.generation_tokens_total, now, before)
    return Load(
        running=int(running) if running is not None else None,
        queued=int(queued) if queued is not None else None,
        gen_tokens_per_s=tps,
        spec_accept_length=engine.accept_length(now.samples, info),
        kv_usage=now.samples.get(names.kv_usage),
    )


@dataclass(frozen=True)
class Window:
    """An engine over a window of /metrics reads: its own decode rate (`Engine.decode_rate`), the running
    requests on average, and the accept length over the window (None without speculation)."""

    seconds: float
    decode_tps: float | None
    running: float | None
    accept_length: float | None


def window_of(engine: Engine, scrapes: list[Scrape]) -> Window:
    """What `scrapes` (in time order, at least one) say of the window they span."""
    first, last = scrapes[0], scrapes[-1]
    running = [s.samples[engine.metrics.running] for s in scrapes if engine.metrics.running in s.samples]
    return Window(
        seconds=last.at - first.at,
        decode_tps=engine.decode_rate([(s.at, s.samples) for s in scrapes]),
        running=sum(running) / len(running) if running else None,
        accept_length=engine.accept_length(counter_deltas(first.samples, last.samples)),
    )
