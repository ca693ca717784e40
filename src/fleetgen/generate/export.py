"""Export a job's results, streamed from the store (never the whole table in memory), written to a temporary
name and renamed (an interrupted export leaves no half file).

- `jsonl` / `parquet`: one row per (record, sample), the columns of `PARQUET_SCHEMA`.
- `sharegpt`: SpecForge's regenerated-data rows (README "SpecForge export"): every assistant turn is one the
  target model generated (the input's own are regenerated; README "Input shapes"). A row SpecForge's
  validator would refuse is dropped and counted by reason (`sharegpt_row`). Truncated rows whose answer
  began are kept: the text is the target model's own; the summary counts them.
- `openai-batch`: the OpenAI Batch API output shape (`custom_id` = `id:sample`, `response.body` a
  chat.completion).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.errors import JobError
from fleetgen.generate.ledger.store import RESULTS, ResultRow, Store
from fleetgen.generate.quality import Flags, has_think_marker
from fleetgen.generate.work import text_of

FORMATS = ("parquet", "jsonl", "sharegpt", "openai-batch")
FLAGS = {flag.split("_", 1)[1]: flag for flag in Flags._fields}  # "leaked_think": "has_leaked_think", …
PARQUET_ROWS = 2000
PARQUET_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sample", pa.int64()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("instance", pa.string()),
        ("model", pa.string()),
        ("num_turns", pa.int64()),
        ("messages", pa.string()),
        ("turns", pa.string()),
        ("is_truncated", pa.bool_()),
        ("is_empty", pa.bool_()),
        ("has_leaked_think", pa.bool_()),
        ("is_repetitive", pa.bool_()),
        ("latency_s", pa.float64()),
        ("params_hash", pa.string()),
    ]
)


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote, what it dropped and why, and what it kept that a reader should know about."""

    path: str
    format: str
    rows: int
    skipped: int
    skipped_reason: str = ""
    dropped: dict[str, int] = field(default_factory=dict)  # reason → rows
    truncated_written: int = 0
    notes: list[str] = field(default_factory=list)


def filter_sql(filters: list[str]) -> str:
    """SQL for `--filter`: `clean` (no flag set), `FLAG` (only rows with it), `no-FLAG` (rows without it)."""
    clauses: list[str] = []
    for raw in filters:
        name = raw.strip().lower().replace("-", "_")
        if name == "clean":
            clauses.extend(f"{column} = 0" for column in FLAGS.values())
            continue
        negate = name.startswith(("no_", "!"))
        flag = name.removeprefix("no_").removeprefix("!")
        if flag not in FLAGS:
            raise JobError(
                f"unknown export filter {raw!r}",
                fix=f"use clean, or one of {', '.join(FLAGS)} (prefix no- to exclude)",
            )
        clauses.append(f"{FLAGS[flag]} = {0 if negate else 1}")
    return " AND ".join(clauses) or "1"


def inline(reasoning: str, content: str) -> str:
    """The reasoning inline before the answer, the way thinking models print it."""
    return f"<think>\n{reasoning}\n</think>\n\n{content}" if reasoning else content


def _turns(row: ResultRow) -> list[tuple[str, str]]:
    if row.turns:
        return [(t["content"], t["reasoning_content"]) for t in orjson.loads(row.turns)]
    return [(row.content or "", row.reasoning_content or "")]


EMPTY = "empty assistant answer (SpecForge rejects it; a truncated row may have spent its tokens reasoning)"
THINK = "a <think> marker in the answer or reasoning (SpecForge --strict-think-markers rejects it)"
NO_REASONING = "no reasoning in a thinking job (SpecForge --expect-reasoning rejects it)"
OLD_PROMPT = (
    "the prompt holds assistant turns the model did not write (stored by an older fleetgen: rerun it)"
)


def sharegpt_row(row: ResultRow, inline_think: bool, thinking: bool = False) -> dict[str, Any] | str:
    """One SpecForge row, or why it is dropped (counted in the summary): what SpecForge's validator
    (`validate_regenerated_data.py --strict-think-markers`, with `--expect-reasoning` for a thinking job)
    would refuse, or a prompt an older fleetgen stored with the input's assistant turns in it."""
    segments = orjson.loads(row.prompt)
    conversation: list[dict[str, Any]] = []
    turns = _turns(row)
    for segment, (content, reasoning) in zip(segments, turns, strict=False):
        for message in segment:
            role = message["role"]
            if role not in ("system", "user") or (role == "system" and conversation):
                return OLD_PROMPT
            text = text_of(message["content"])
            if conversation and conversation[-1]["role"] == role == "user":
                return OLD_PROMPT  # two user turns in a row: merged by today's source, not by older ones
            conversation.append({"role": role, "content": text})
        if not inline_think and (has_think_marker(content) or has_think_marker(reasoning)):
            return THINK
        if thinking and not inline_think and not reasoning.strip():
            return NO_REASONING
        answer = inline(reasoning, content) if inline_think else content
        if not answer.strip():
            return EMPTY
        generated: dict[str, Any] = {"role": "assistant", "content": answer}
        if not inline_think:
            generated["reasoning_content"] = reasoning
        conversation.append(generated)
    if len(turns) != len(segments) or not any(m["role"] == "user" for m in conversation):
        return OLD_PROMPT
    row_id = row.id if row.sample == 0 else f"{row.id}-s{row.sample}"
    return {"id": row_id, "status": "success", "conversations": conversation}


def flat_row(row: ResultRow, inline_think: bool) -> dict[str, Any]:
    """One jsonl / parquet row: `PARQUET_SCHEMA`'s columns, the flags as booleans."""
    content, reasoning = row.content or "", row.reasoning_content or ""
    if inline_think:
        content, reasoning = inline(reasoning, content), ""
    stored = row._asdict()
    flat = {name: stored.get(name) for name in PARQUET_SCHEMA.names}
    flat.update(content=content, reasoning_content=reasoning, messages=row.prompt)
    flat.update({flag: bool(stored[flag]) for flag in FLAGS.values()})
    return flat


def batch_row(row: ResultRow) -> dict[str, Any]:
    """One OpenAI Batch API output line."""
    message = {"role": "assistant", "content": row.content, "reasoning_content": row.reasoning_content}
    usage = {
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "total_tokens": (row.prompt_tokens or 0) + (row.completion_tokens or 0),
    }
    body = {
        "object": "chat.completion",
        "model": row.model,
        "usage": usage,
        "choices": [{"index": 0, "message": message, "finish_reason": row.finish_reason}],
    }
    return {
        "custom_id": f"{row.id}:{row.sample}",
        "response": {"status_code": 200, "body": body},
        "error": None,
    }


def export(
    out_dir: Path, fmt: str, to: Path, filters: list[str] | None = None, inline_think: bool = False
) -> ExportSummary:
    """Stream the results of `out_dir` into `to` in `fmt`; returns what was written and dropped, and why."""
    if fmt not in FORMATS:
        raise JobError(f"unknown export format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
    store = Store.open(out_dir, writer=False)
    tmp = to.with_name(f".{to.name}.tmp-{os.getpid()}")
    tally = _Tally()
    try:
        thinking = bool(orjson.loads(store.get_meta("params") or "{}").get("thinking"))
        item_of: Callable[[ResultRow], dict[str, Any] | str] = {
            "sharegpt": lambda row: sharegpt_row(row, inline_think, thinking),
            "openai-batch": batch_row,
        }.get(fmt, lambda row: flat_row(row, inline_think))
        items = tally.kept(store.iter_rows(RESULTS, where=filter_sql(filters or [])), item_of)
        to.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            with pq.ParquetWriter(str(tmp), PARQUET_SCHEMA) as writer:
                while chunk := list(itertools.islice(items, PARQUET_ROWS)):
                    writer.write_table(pa.Table.from_pylist(chunk, schema=PARQUET_SCHEMA))
        else:
            with tmp.open("wb") as handle:
                handle.writelines(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE) for item in items)
        tmp.replace(to)
    except OSError as exc:
        raise JobError(f"cannot write {to}: {exc.strerror}", fix="check the path and free space") from exc
    finally:
        store.close()
        tmp.unlink(missing_ok=True)
    return tally.summary(str(to), fmt)


@dataclass
class _Tally:
    written: int = 0
    truncated_written: int = 0
    truncated_dropped: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def kept(
        self, rows: Iterable[ResultRow], item_of: Callable[[ResultRow], dict[str, Any] | str]
    ) -> Iterator[dict[str, Any]]:
        """Each row's item; a row whose item is a reason is dropped, counted by that reason."""
        for row in rows:
            item = item_of(row)
            if isinstance(item, str):
                self.dropped[item] += 1
                self.truncated_dropped += bool(row.is_truncated)
                continue
            self.written += 1
            self.truncated_written += bool(row.is_truncated)
            yield item

    def summary(self, path: str, fmt: str) -> ExportSummary:
        notes = []
        if self.truncated_written:
            notes.append(
                f"{self.truncated_written} truncated rows written (cut at max_tokens): the text is the "
                "target model's own, and a drafter learns from every token of it; --filter no-truncated "
                "leaves them out"
            )
        if self.truncated_dropped:
            notes.append(f"{self.truncated_dropped} truncated rows dropped (counted in the reasons below)")
        dropped = dict(self.dropped.most_common())
        reason = "; ".join(f"{n}: {why}" for why, n in dropped.items())
        return ExportSummary(
            path, fmt, self.written, sum(dropped.values()), reason, dropped, self.truncated_written, notes
        )
