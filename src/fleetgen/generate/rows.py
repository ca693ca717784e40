"""Rows for the store and snapshots for the view, built from finished work.

Kept apart from the runner so the shape of a stored row is defined in one place (`RESULT_COLUMNS` order).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from fleetgen.generate.client import RequestFailed
from fleetgen.generate.dispatch import Dispatcher, Endpoint
from fleetgen.generate.progress import BadInputSample, Counters, EndpointProgress, Progress, Summary
from fleetgen.generate.quality import flags_of_all
from fleetgen.generate.store import RESULT_COLUMNS, Store
from fleetgen.generate.work import BadInput, Work

LINE = RESULT_COLUMNS.index("line")
COMPLETION_TOKENS = RESULT_COLUMNS.index("completion_tokens")
IS_TRUNCATED = RESULT_COLUMNS.index("is_truncated")
NUM_BAD_SAMPLES = 20


def request_body(base: dict[str, Any], work: Work, seed: int | None) -> dict[str, Any]:
    """The body of the next request of `work`: the job's shared fields, this turn's history, its seed."""
    body = dict(base)
    body["messages"] = work.messages_for_next_turn()
    if seed is not None:
        body["seed"] = seed + work.sample  # samples of one record differ, yet each is reproducible
    return body


class RowBuilder:
    """Turns finished work into `results` / `errors` rows (tuples in the store's column order)."""

    def __init__(self, model: str, params_hash: str) -> None:
        self.model = model
        self.params_hash = params_hash

    def result(self, endpoint: str, work: Work, started_at: float, latency_s: float) -> tuple[Any, ...]:
        turns = work.done
        last = turns[-1]
        flags = flags_of_all(turns)
        is_truncated = any(t.finish_reason == "length" for t in turns)
        multi = None
        if len(turns) > 1:
            multi = orjson.dumps(
                [
                    {
                        "content": t.content,
                        "reasoning_content": t.reasoning_content,
                        "finish_reason": t.finish_reason,
                        "prompt_tokens": t.prompt_tokens,
                        "completion_tokens": t.completion_tokens,
                    }
                    for t in turns
                ]
            ).decode()
        return (
            work.record_id, work.sample, work.key, work.source, work.line,
            orjson.dumps(work.segments).decode(), last.content, last.reasoning_content, multi, len(turns),
            "length" if is_truncated else last.finish_reason,
            _sum(t.prompt_tokens for t in turns), _sum(t.completion_tokens for t in turns),
            endpoint, self.model, self.params_hash, work.attempts + 1, started_at, latency_s, time.time(),
            int(is_truncated), int(flags.is_empty), int(flags.has_leaked_think), int(flags.is_repetitive),
            work.content_hash,
        )  # fmt: skip

    def error(self, endpoint: str, work: Work, exc: RequestFailed) -> tuple[Any, ...]:
        reason = exc.message
        if exc.is_retryable:
            reason = f"gave up after {work.attempts} attempts: {reason}"
        if exc.kind == "prompt_too_long":
            reason = f"prompt longer than the context ({work.source}:{work.line}): {reason}"
        return (
            work.record_id,
            work.sample,
            work.key,
            work.source,
            work.line,
            exc.kind,
            reason,
            exc.status,
            work.attempts + (0 if exc.is_retryable else 1),
            endpoint,
            time.time(),
            work.content_hash,
        )


def _sum(values: Any) -> int | None:
    total, seen = 0, False
    for value in values:
        if value is not None:
            total, seen = total + value, True
    return total if seen else None


def bad_row(bad: BadInput) -> tuple[Any, ...]:
    return (bad.source, bad.line, bad.record_id, bad.reason, time.time())


def series_rows(
    endpoints: list[Endpoint], accept_lengths: Mapping[str, float | None]
) -> list[tuple[Any, ...]]:
    """One time-series sample per endpoint: cumulative counts, in flight, the last scraped accept length."""
    t = time.time()
    return [
        (t, e.name, e.completions, e.output_tokens, e.in_flight, accept_lengths.get(e.name))
        for e in endpoints
    ]


def snapshot(
    counters: Counters,
    samples: int,
    total: int | None,
    dispatcher: Dispatcher,
    started: float,
    rate: float,
    tok_rate: float,
    endpoint_rates: dict[str, float],
    stopping: bool,
    is_normal: bool,
) -> Progress:
    """The progress view's snapshot: counts of committed rows only."""
    done = counters.results + counters.errors + counters.bad * samples
    if is_normal:
        done += counters.done_before
    eta = (total - done) / rate if total is not None and rate > 0 and total >= done else None
    return Progress(
        done=done, total=total, completions_per_s=rate, output_tokens_per_s=tok_rate, eta_s=eta,
        errors=counters.errors_before * is_normal + counters.errors,
        truncated=counters.truncated_before * is_normal + counters.truncated, bad_inputs=counters.bad,
        in_flight=dispatcher.num_in_flight, retrying=dispatcher.num_retrying,
        elapsed_s=time.monotonic() - started, stopping=stopping,
        endpoints=[EndpointProgress(e.name, e.state.value, e.in_flight, e.cap, e.completions,
                                    endpoint_rates.get(e.name, 0.0), e.last_error)
                   for e in dispatcher.endpoints],
    )  # fmt: skip


def summary(
    store: Store,
    status: str,
    model: str,
    counters: Counters,
    elapsed_s: float,
    endpoints: dict[str, int],
) -> Summary:
    """The final summary, re-read from the store (what is on disk, not what we think we wrote)."""
    counts = store.counts()
    bad = [
        BadInputSample(str(r[0]), int(r[1]), str(r[2]))
        for r in store.conn.execute(
            "SELECT source, line, reason FROM inputs_bad ORDER BY source, line LIMIT ?", (NUM_BAD_SAMPLES,)
        )
    ]
    return Summary(
        status=status,
        out_dir=str(store.path.parent),
        model=model,
        completions_this_run=counters.results,
        output_tokens_this_run=counters.output_tokens,
        errors_this_run=counters.errors,
        elapsed_s=elapsed_s,
        results=counts.results,
        errors=counts.errors,
        truncated=counts.truncated,
        bad_inputs=counts.bad_inputs,
        bad_input_samples=bad,
        endpoints=endpoints,
    )
