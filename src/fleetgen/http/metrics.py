"""An engine's numbers, read one way for every caller: its /metrics text → counters, gauges, load, accept
length.

The one reader of /metrics (`run`'s scraper, `status`, `bench`, `tune`, `up`'s verify all come here). A
page is large (SGLang 0.5.15's: 530 lines, 64 families) and fleetgen reads a dozen samples of it
(`MetricNames.read`, over every registered engine): `read_lines` picks those samples' lines by name
(`str.find`, no line split), then prometheus_client's reference parser reads them, so the format stays the
library's (~0.5 ms a page here against ~15 ms for the whole page: a core fills at ~2,000 servers scraped
every 3 s, not at ~200).
Samples are summed over label sets (per-position and per-DP-rank series add up to the engine-wide figure).
SGLang exports gauges (`sglang:gen_throughput`); vLLM only counters, so its throughput is the rate of
`vllm:generation_tokens_total` between two reads and its accept length over a window (`accept_length`): the
figure of the last seconds, of a bench level or of one test request.

A `Scrape` holds the samples and each sample name's labels. Load: running, queued, tok/s, KV use, accept
length. `accept_length` is THE accept length of an engine between two reads (status, run's series, bench,
tune, verify). `window_of` reads a window of scrapes: the engine's own decode rate, mean running, accept
length.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetgen.engines import Engine, engine_of_metrics, metric_names_read
from fleetgen.engines.base import Labels
from fleetgen.errors import EndpointError

# What an exposition's first line is: a comment, or a sample (`name{...} value` / `name value`).
_EXPOSITION_START = re.compile(r"\s*(#|[a-zA-Z_:][a-zA-Z0-9_:]*[{ ]|$)")
_FIX = "check that the URL is an engine's (http://host:port) serving Prometheus text at /metrics"


def read_lines(text: str, names: Collection[str]) -> str:
    """The sample lines of `text` whose metric name is one of `names`, in the page's order: what fleetgen
    parses of a page. Comments (HELP/TYPE) are left out: a sample's name and value do not depend on them."""
    found: list[tuple[int, str]] = []
    for name in names:
        at = text.find(name)
        while at >= 0:
            end = at + len(name)
            if (at == 0 or text[at - 1] == "\n") and text[end : end + 1] in ("{", " "):
                stop = text.find("\n", end)
                found.append((at, text[at : stop if stop >= 0 else len(text)]))
            at = text.find(name, end)
    return "".join(line + "\n" for _, line in sorted(found))


@dataclass(frozen=True)
class Scrape:
    """One /metrics read, parsed once for what fleetgen reads (`MetricNames.read`): samples (summed over
    labels), when (monotonic seconds), and each sample name's first label set (where an info-style metric
    carries figures, which `Engine.capacity` reads)."""

    at: float
    samples: dict[str, float]
    labels: Labels = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, at: float = 0.0) -> Scrape:
        """Prometheus text → a Scrape taken `at`, of the samples any registered engine's reads."""
        if not _EXPOSITION_START.match(text):
            raise EndpointError(f"not Prometheus text at /metrics: {text[:80]!r}", fix=_FIX)
        totals: dict[str, float] = {}
        labels: dict[str, Mapping[str, str]] = {}
        try:
            for family in text_string_to_metric_families(read_lines(text, metric_names_read())):
                for sample in family.samples:
                    totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
                    labels.setdefault(sample.name, sample.labels)
        except ValueError as exc:
            raise EndpointError(f"unparseable /metrics text: {exc}", fix=_FIX) from exc
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


def accept_length(
    engine: Engine | None,
    now: Mapping[str, float],
    before: Mapping[str, float] | None = None,
    info: Any = None,
) -> float | None:
    """THE accept length of an engine (mean tokens per speculative step, bonus included) as its samples `now`
    say, over the window since `before` for engines that only count (vLLM: since the server started without
    `before`), else its `info` JSON. `engine` None: the one whose metric names `now` carries (bare URLs).
    None when speculative decoding is off or made no step in the window."""
    return (engine or engine_of_metrics(now)).accept_length(counter_deltas(before or {}, now), info)


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
        spec_accept_length=accept_length(engine, now.samples, before.samples if before else None, info),
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
        accept_length=accept_length(engine, last.samples, first.samples),
    )
