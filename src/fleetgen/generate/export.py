"""Export a job's results, streamed from the store (never the whole table in memory).

Formats:
- `jsonl` / `parquet`: one row per (record, sample) with id, sample, content, reasoning_content,
  finish_reason, prompt_tokens, completion_tokens, instance, the quality flags and the prompt.
- `sharegpt`: SpecForge's regenerated-data rows: `id`, `status: "success"`, `conversations` alternating
  user/assistant, assistant turns carrying `reasoning_content` (or, with `inline_think`, the reasoning inline
  as `<think>…</think>` before the answer). Rows with an empty assistant answer are skipped and counted:
  SpecForge refuses them.
- `openai-batch`: the OpenAI Batch API output shape (`custom_id` = `id:sample`, `response.body` a
  chat.completion).
The file is written to a temporary name and renamed: an interrupted export leaves no half file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.errors import JobError
from fleetgen.generate.store import Store

FORMATS = ("parquet", "jsonl", "sharegpt", "openai-batch")
FLAGS = {"truncated": "is_truncated", "empty": "is_empty", "leaked_think": "has_leaked_think",
         "repetitive": "is_repetitive"}  # fmt: skip
PARQUET_ROWS = 2000
PARQUET_SCHEMA = pa.schema([
    ("id", pa.string()), ("sample", pa.int64()), ("content", pa.string()), ("reasoning_content", pa.string()),
    ("finish_reason", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
    ("instance", pa.string()), ("model", pa.string()), ("num_turns", pa.int64()), ("messages", pa.string()),
    ("turns", pa.string()), ("is_truncated", pa.bool_()), ("is_empty", pa.bool_()),
    ("has_leaked_think", pa.bool_()), ("is_repetitive", pa.bool_()), ("latency_s", pa.float64()),
    ("params_hash", pa.string()),
])  # fmt: skip


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote."""

    path: str
    format: str
    rows: int
    skipped: int
    skipped_reason: str = ""


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


def _turns(row: Any) -> list[tuple[str, str]]:
    if row["turns"]:
        return [(t["content"], t["reasoning_content"]) for t in orjson.loads(row["turns"])]
    return [(row["content"] or "", row["reasoning_content"] or "")]


def sharegpt_row(row: Any, inline_think: bool) -> dict[str, Any] | None:
    """One SpecForge row, or None when an assistant answer is empty (SpecForge rejects those)."""
    segments = orjson.loads(row["prompt"])
    conversation: list[dict[str, Any]] = []
    for segment, (content, reasoning) in zip(segments, _turns(row), strict=False):
        conversation.extend({"role": m["role"], "content": _text(m["content"])} for m in segment)
        answer = inline(reasoning, content) if inline_think else content
        if not answer.strip():
            return None
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if not inline_think:
            message["reasoning_content"] = reasoning
        conversation.append(message)
    row_id = row["id"] if row["sample"] == 0 else f"{row['id']}-s{row['sample']}"
    return {"id": row_id, "status": "success", "conversations": conversation}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def flat_row(row: Any, inline_think: bool) -> dict[str, Any]:
    """One jsonl / parquet row."""
    content, reasoning = row["content"] or "", row["reasoning_content"] or ""
    if inline_think:
        content, reasoning = inline(reasoning, content), ""
    return {
        "id": row["id"], "sample": row["sample"], "content": content, "reasoning_content": reasoning,
        "finish_reason": row["finish_reason"], "prompt_tokens": row["prompt_tokens"],
        "completion_tokens": row["completion_tokens"], "instance": row["instance"], "model": row["model"],
        "num_turns": row["num_turns"], "messages": row["prompt"], "turns": row["turns"],
        "is_truncated": bool(row["is_truncated"]), "is_empty": bool(row["is_empty"]),
        "has_leaked_think": bool(row["has_leaked_think"]), "is_repetitive": bool(row["is_repetitive"]),
        "latency_s": row["latency_s"], "params_hash": row["params_hash"],
    }  # fmt: skip


def batch_row(row: Any) -> dict[str, Any]:
    """One OpenAI Batch API output line."""
    message = {"role": "assistant", "content": row["content"], "reasoning_content": row["reasoning_content"]}
    usage = {"prompt_tokens": row["prompt_tokens"], "completion_tokens": row["completion_tokens"],
             "total_tokens": (row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)}  # fmt: skip
    body = {"object": "chat.completion", "model": row["model"], "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": row["finish_reason"]}]}  # fmt: skip
    return {"custom_id": f"{row['id']}:{row['sample']}", "response": {"status_code": 200, "body": body},
            "error": None}  # fmt: skip


def export(
    out_dir: Path, fmt: str, to: Path, filters: list[str] | None = None, inline_think: bool = False
) -> ExportSummary:
    """Stream the results of `out_dir` into `to` in `fmt`; returns what was written."""
    if fmt not in FORMATS:
        raise JobError(f"unknown export format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
    store = Store.open(out_dir, writer=False)
    tmp = to.with_name(f".{to.name}.tmp-{os.getpid()}")
    try:
        rows = store.iter_rows(f"SELECT * FROM results WHERE {filter_sql(filters or [])} ORDER BY rowid")
        to.parent.mkdir(parents=True, exist_ok=True)
        written, skipped = (_parquet(rows, tmp, inline_think) if fmt == "parquet"
                            else _jsonl(rows, tmp, fmt, inline_think))  # fmt: skip
        tmp.replace(to)
    except OSError as exc:
        raise JobError(f"cannot write {to}: {exc.strerror}", fix="check the path and free space") from exc
    finally:
        store.close()
        tmp.unlink(missing_ok=True)
    why = "empty assistant answer (SpecForge rejects it)" if skipped else ""
    return ExportSummary(str(to), fmt, written, skipped, why)


def _jsonl(rows: Iterable[Any], path: Path, fmt: str, inline_think: bool) -> tuple[int, int]:
    written = skipped = 0
    with path.open("wb") as handle:
        for row in rows:
            item = _item(row, fmt, inline_think)
            if item is None:
                skipped += 1
                continue
            _write_line(handle, item)
            written += 1
    return written, skipped


def _item(row: Any, fmt: str, inline_think: bool) -> dict[str, Any] | None:
    if fmt == "sharegpt":
        return sharegpt_row(row, inline_think)
    return batch_row(row) if fmt == "openai-batch" else flat_row(row, inline_think)


def _write_line(handle: IO[bytes], item: dict[str, Any]) -> None:
    handle.write(orjson.dumps(item))
    handle.write(b"\n")


def _parquet(rows: Iterable[Any], path: Path, inline_think: bool) -> tuple[int, int]:
    written = 0
    with pq.ParquetWriter(str(path), PARQUET_SCHEMA) as writer:
        chunk: list[dict[str, Any]] = []
        for row in rows:
            chunk.append(flat_row(row, inline_think))
            if len(chunk) >= PARQUET_ROWS:
                writer.write_table(pa.Table.from_pylist(chunk, schema=PARQUET_SCHEMA))
                written += len(chunk)
                chunk = []
        if chunk:
            writer.write_table(pa.Table.from_pylist(chunk, schema=PARQUET_SCHEMA))
            written += len(chunk)
    return written, 0
