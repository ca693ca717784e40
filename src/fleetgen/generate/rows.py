"""Rows for the store and the final summary, built from finished work.

The records themselves (`ResultRow`, …) and their columns are defined once, in `store`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fleetgen.generate.health import Endpoint
from fleetgen.generate.ledger import tokenids
from fleetgen.generate.ledger.schema import BadRow, ErrorRow, ResultRow, SeriesRow
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.ledger.tokenids import TokenIds
from fleetgen.generate.progress import BadInputSample, Counters, RunEnd, Summary
from fleetgen.generate.quality import flags_of_all
from fleetgen.generate.work import BadInput, Work
from fleetgen.http.client import Completion, RequestFailed

NUM_BAD_SAMPLES = 20


@dataclass(frozen=True)
class RowBuilder:
    """Turns finished work into `results` / `errors` rows."""

    model: str
    params_hash: str
    input_index: int = 0  # which input of the folder the run reads (`jobmeta.input_index`)

    def result(self, endpoint: str, work: Work, started_at: float, latency_s: float) -> ResultRow:
        turns = work.done
        last = turns[-1]
        flags = flags_of_all(turns)
        return ResultRow(
            **_keys(work),
            prompt=orjson.dumps(work.record.segments).decode(),
            content=last.content,
            reasoning_content=last.reasoning_content,
            turns=_turns_json(turns) if len(turns) > 1 else None,
            num_turns=len(turns),
            finish_reason="length" if flags.is_truncated else last.finish_reason,
            prompt_tokens=_sum(t.prompt_tokens for t in turns),
            completion_tokens=_sum(t.completion_tokens for t in turns),
            instance=endpoint,
            model=self.model,
            params_hash=self.params_hash,
            attempts=work.attempts + 1,
            started_at=started_at,
            latency_s=latency_s,
            finished_at=time.time(),
            is_truncated=int(flags.is_truncated),
            is_empty=int(flags.is_empty),
            has_leaked_think=int(flags.has_leaked_think),
            is_repetitive=int(flags.is_repetitive),
            chash=work.record.content_hash,
            input_index=self.input_index,
            token_ids=_token_ids(last),
        )

    def error(self, endpoint: str, work: Work, exc: RequestFailed) -> ErrorRow:
        reason = exc.message
        if exc.is_retryable:
            reason = f"gave up after {work.attempts} attempts: {reason}"
        if exc.kind == "prompt_too_long":
            reason = f"prompt longer than the context ({work.record.source}:{work.record.line}): {reason}"
        return ErrorRow(
            **_keys(work),
            kind=exc.kind,
            reason=reason,
            status=exc.status,
            attempts=work.attempts + (0 if exc.is_retryable else 1),
            instance=endpoint,
            finished_at=time.time(),
            chash=work.record.content_hash,
            input_index=self.input_index,
        )


TURN_FIELDS = ("content", "reasoning_content", "finish_reason", "prompt_tokens", "completion_tokens")


def _turns_json(turns: list[Completion]) -> str:
    """Every turn's text and counts (its token ids are the last turn's column, not repeated here)."""
    return orjson.dumps([{name: getattr(t, name) for name in TURN_FIELDS} for t in turns]).decode()


def _token_ids(last: Completion) -> bytes | None:
    """The last turn's prompt and answer ids, where the engine returned both, packed for the store."""
    if last.prompt_token_ids is None or last.token_ids is None:
        return None
    return tokenids.pack(TokenIds(last.prompt_token_ids, last.token_ids))


def _keys(work: Work) -> dict[str, Any]:
    """The columns a result and an error row share: the key and where the record was read."""
    record = work.record
    return {
        "id": record.record_id,
        "sample": work.sample,
        "khash": work.key,
        "source": record.source,
        "line": record.line,
    }


def _sum(values: Iterable[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def bad_row(bad: BadInput, input_index: int) -> BadRow:
    return BadRow(bad.source, bad.line, bad.record_id, bad.reason, time.time(), input_index)


def series_rows(endpoints: list[Endpoint], accept_lengths: Mapping[str, float | None]) -> list[SeriesRow]:
    """One time-series sample per endpoint: cumulative counts, in flight, the last scraped accept length."""
    t = time.time()
    return [
        SeriesRow(t, e.name, e.completions, e.output_tokens, e.in_flight, accept_lengths.get(e.name))
        for e in endpoints
    ]


def summary(
    store: Store,
    status: RunEnd,
    model: str,
    counters: Counters,
    elapsed_s: float,
    endpoints: dict[str, int],
) -> Summary:
    """The final summary, re-read from the store (what is on disk, not what we think we wrote)."""
    bad = [
        BadInputSample(str(source), int(line), str(reason))
        for source, line, reason in store.conn.execute(
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
        bad_input_samples=bad,
        endpoints=endpoints,
        **store.counts()._asdict(),  # results, errors, truncated, bad_inputs: what the store holds
    )
