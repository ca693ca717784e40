"""Export a job's results, streamed from the store (never the whole table in memory), written to a temporary
name and renamed (an interrupted export leaves no half file).

- `jsonl` / `parquet`: one row per (record, sample), the columns of `PARQUET_SCHEMA`.
- `sharegpt`: SpecForge's regenerated-data rows (README "SpecForge export"): every assistant turn is one the
  target model generated (the input's own are regenerated; README "Input shapes"). A row SpecForge's
  validator would refuse is dropped and counted by reason (`sharegpt_row`). Truncated rows whose answer
  began are kept: the text is the target model's own; the summary counts them.
- `specforge-tokens`: SpecForge's pre-tokenized rows (`data.prompts_path`): `input_ids` + `loss_mask`, the
  target's exact tokens where the run stored them, built with the job's recorded chat template
  (`export_tokens`).
- `openai-batch`: the OpenAI Batch API output shape (`custom_id` = `id:sample`, `response.body` a
  chat.completion).

The training exports (`sharegpt`, `specforge-tokens`) take the trainer's `max_length`: rows longer (counted
in the served tokens) are cut where the trainer cuts (its first `max_length` tokens: SpecForge's
`input_ids[:max_length]`) or dropped, and the summary says how many trained tokens fall past it. A sharegpt
row cannot be cut as text: it is written whole (the trainer cuts it) or dropped. Every export writes a
sidecar, `<file>.meta.json` (`export_meta`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.chattemplate import TOKENIZER_FILE
from fleetgen.errors import JobError
from fleetgen.generate.export_meta import sidecar, write_sidecar
from fleetgen.generate.export_tally import ExportSummary, Tally
from fleetgen.generate.export_tokens import TokenBuilder, row_id, turns_of
from fleetgen.generate.ledger.schema import RESULTS, ResultRow
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.modelfiles import MAX_LENGTH, kept_folder, recorded_template
from fleetgen.generate.quality import Flags, has_think_marker
from fleetgen.generate.work import text_of

FORMATS = ("parquet", "jsonl", "sharegpt", "specforge-tokens", "openai-batch")
TRAINING_FORMATS = ("sharegpt", "specforge-tokens")
OVER_LENGTH = ("cut", "drop")
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
    turns = turns_of(row)
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
    return {"id": row_id(row), "status": "success", "conversations": conversation}


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
    out_dir: Path,
    fmt: str,
    to: Path,
    filters: list[str] | None = None,
    inline_think: bool = False,
    *,
    max_length: int | None = None,
    over_length: str = "cut",
    model_dir: Path | None = None,
) -> ExportSummary:
    """Stream the results of `out_dir` into `to` in `fmt`, and its sidecar beside it; returns what was
    written and dropped, and why. `model_dir`: the tokenizer files to build tokens with (default: those the
    run kept, `modelfiles.kept_folder`); `max_length` defaults to the job file's, for a training format."""
    _check_options(fmt, max_length, over_length)
    store = Store.open(out_dir, writer=False)
    tmp = to.with_name(f".{to.name}.tmp-{os.getpid()}")
    try:
        if max_length is None and fmt in TRAINING_FORMATS:
            max_length = orjson.loads(store.get_meta(MAX_LENGTH) or "null")
        params = orjson.loads(store.get_meta("params") or "{}")
        thinking = bool(params.get("thinking"))
        builder = None
        if fmt == "specforge-tokens" or (max_length is not None and fmt in TRAINING_FORMATS):
            builder = _builder(store, out_dir, model_dir, thinking)
        tally = Tally(builder, max_length, over_length)
        item_of: Callable[[ResultRow], dict[str, Any] | str] = {
            "sharegpt": lambda row: tally.measured(row, sharegpt_row(row, inline_think, thinking)),
            "specforge-tokens": tally.token_item,
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
        summary = tally.summary(str(to), fmt)
        about = sidecar(
            store, dataclasses.asdict(summary), tally.models, filters or [], inline_think, builder
        )
        write_sidecar(to, about)
    except OSError as exc:
        raise JobError(f"cannot write {to}: {exc.strerror}", fix="check the path and free space") from exc
    finally:
        store.close()
        tmp.unlink(missing_ok=True)
    return summary


def _check_options(fmt: str, max_length: int | None, over_length: str) -> None:
    if fmt not in FORMATS:
        raise JobError(f"unknown export format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
    if over_length not in OVER_LENGTH:
        raise JobError(f"unknown --over-length {over_length!r}", fix=f"use one of {', '.join(OVER_LENGTH)}")
    if max_length is not None and fmt not in TRAINING_FORMATS:
        raise JobError(
            f"--max-length is the trainer's: {fmt} is not a training format",
            fix=f"use it with --format {' or '.join(TRAINING_FORMATS)}, or leave it out",
        )
    if max_length is not None and max_length < 1:
        raise JobError(
            f"--max-length {max_length}: a length is at least 1", fix="give the trainer's max_length"
        )


def _builder(store: Store, out_dir: Path, model_dir: Path | None, thinking: bool) -> TokenBuilder:
    """Tokens with the model folder the run kept (or `model_dir`); refused where there is none."""
    folder = model_dir or kept_folder(out_dir)
    if not (folder / TOKENIZER_FILE).is_file():
        raise JobError(
            f"no model tokenizer to build tokens with: {folder} has no {TOKENIZER_FILE} (the run recorded no "
            "model folder: it ran on --endpoint URLs without model_dir in its job file)",
            fix="pass --model-dir with the model folder the servers load (its chat template and "
            "tokenizer.json)",
            context={"store": str(store.path)},
        )
    recorded = (recorded_template(store) or {}).get("thinking")
    return TokenBuilder(folder, thinking if recorded is None else bool(recorded))
