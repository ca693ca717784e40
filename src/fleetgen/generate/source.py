"""Input records, streamed: JSONL, Parquet, or a local Hugging Face `datasets` folder (its Arrow files).

Each record becomes the segments of a `Work` item (see `work.py`) or a `BadInput` naming file, line and
reason. Memory does not grow with the dataset: files are read line by line or batch by batch, and a resume
position (`Position`) lets a rerun start past the prefix that is already complete.

Record shapes: `messages` (chat, sent as given), `conversations` (ShareGPT `from`/`value` or `role`/`content`:
the assistant turns are dropped and regenerated in order), or a prompt field (one user message).
The id comes from a configurable field, else a stable hash of the record's canonical JSON.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.errors import InputError
from fleetgen.generate.work import BadInput, Message

ROLE_OF = {
    "human": "user", "user": "user", "system": "system",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "model": "assistant", "bot": "assistant",
}  # fmt: skip
BATCH_ROWS = 1024


@dataclass(frozen=True, slots=True)
class Position:
    """Where reading resumes: the last complete line number and, for JSONL, the byte offset after it."""

    line: int = 0
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """One good input record, ready to become work (one `Work` per sample)."""

    record_id: str
    source: str
    line: int
    end_offset: int
    segments: list[list[Message]]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A run of records the caller said are done (`is_done(record id)`): where the last one ends.

    One per run of consecutive done records (at most `SKIP_RUN` lines), not one per record: a resume that
    passes over a million done records costs a JSON parse and a key lookup each, nothing more.
    """

    line: int
    end_offset: int


IsDone = Callable[[str], bool]
SKIP_RUN = 65536


@dataclass(frozen=True, slots=True)
class RecordShape:
    """How to read records: which field holds the id and which the prompt; an optional system prompt."""

    id_field: str = "id"
    prompt_field: str = "prompt"
    system_prompt: str | None = None


def content_id(record: dict[str, Any]) -> str:
    """A stable id from the record's canonical JSON (sorted keys): the same record → the same id."""
    canonical = orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return "h" + hashlib.blake2b(canonical, digest_size=12).hexdigest()


def to_segments(record: dict[str, Any], shape: RecordShape) -> list[list[Message]] | str:
    """The turn segments of a record, or the reason it cannot be used."""
    if "messages" in record:
        segments = _from_messages(record["messages"])
    elif "conversations" in record:
        segments = _from_conversations(record["conversations"])
    elif shape.prompt_field in record:
        prompt = record[shape.prompt_field]
        if not isinstance(prompt, str) or not prompt.strip():
            return f"field {shape.prompt_field!r} is empty or not a string"
        segments = [[{"role": "user", "content": prompt}]]
    else:
        return f"missing field: the record has none of 'messages', 'conversations', {shape.prompt_field!r}"
    if isinstance(segments, str):
        return segments
    if shape.system_prompt and segments[0][0].get("role") != "system":
        segments[0].insert(0, {"role": "system", "content": shape.system_prompt})
    return segments


def _check_message(message: object, index: int) -> str | None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return f"message {index} is not an object with a string 'role'"
    content = message.get("content")
    if not isinstance(content, str | list) or not content:
        return f"message {index} has empty or missing 'content'"
    return None


def _from_messages(messages: object) -> list[list[Message]] | str:
    if not isinstance(messages, list) or not messages:
        return "empty messages: 'messages' must be a non-empty list"
    for index, message in enumerate(messages):
        if (problem := _check_message(message, index)) is not None:
            return problem
    kept = list(messages)
    while kept and kept[-1]["role"] == "assistant":  # a trailing answer is the one to regenerate
        kept.pop()
    if not any(m["role"] == "user" for m in kept):
        return "no user message in 'messages'"
    return [kept]


def _from_conversations(turns: object) -> list[list[Message]] | str:
    if not isinstance(turns, list) or not turns:
        return "empty conversations: 'conversations' must be a non-empty list"
    segments: list[list[Message]] = []
    pending: list[Message] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"conversation turn {index} is not an object"
        speaker = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        role = ROLE_OF.get(str(speaker).lower())
        if role is None:
            return f"conversation turn {index} has unknown speaker {speaker!r}"
        if role == "assistant":
            if any(m["role"] == "user" for m in pending):
                segments.append(pending)
                pending = []
            continue  # the model writes its own answers
        if not isinstance(text, str) or not text.strip():
            return f"conversation turn {index} has empty text"
        pending.append({"role": role, "content": text})
    if any(m["role"] == "user" for m in pending):
        segments.append(pending)
    return segments or "no user turn in 'conversations'"


def record_id_of(raw: dict[str, Any], shape: RecordShape) -> str:
    """The record's id: its id field, else the hash of its content."""
    value = raw.get(shape.id_field)
    return str(value) if value not in (None, "") else content_id(raw)


def _record_of(
    raw: object, shape: RecordShape, source: str, line: int, end: int, is_done: IsDone | None = None
) -> Record | BadInput | None:
    """The record on a line; None when `is_done` says it is done (no messages are built for it)."""
    if not isinstance(raw, dict):
        return BadInput(source, line, f"expected a JSON object, got {type(raw).__name__}", None, end)
    record_id = record_id_of(raw, shape)
    if is_done is not None and is_done(record_id):
        return None
    segments = to_segments(raw, shape)
    if isinstance(segments, str):
        return BadInput(source, line, segments, record_id, end)
    return Record(record_id, source, line, end, segments)


def read_jsonl(
    path: Path, shape: RecordShape, start: Position, is_done: IsDone | None = None
) -> Iterator[Record | BadInput | Skipped]:
    """Records of a JSONL file from `start`; a malformed line becomes `BadInput`; blank lines are skipped;
    runs of records `is_done` says are done become one `Skipped`."""
    source = str(path)
    with _open(path) as handle:
        handle.seek(start.offset)
        line, offset = start.line, start.offset
        num_skipped = 0
        for raw in handle:
            line += 1
            offset += len(raw)
            if not raw.strip():
                continue
            item: Record | BadInput | None
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                item = BadInput(source, line, f"malformed JSON: {exc}", None, offset)
            else:
                item = _record_of(parsed, shape, source, line, offset, is_done)
            if item is None:
                num_skipped += 1
                if num_skipped == SKIP_RUN:
                    num_skipped = 0
                    yield Skipped(line, offset)
                continue
            if num_skipped:
                num_skipped = 0
                yield Skipped(line - 1, offset - len(raw))  # the run ends on the line before this one
            yield item
        if num_skipped:
            yield Skipped(line, offset)


def read_batches(
    batches: Iterator[pa.RecordBatch],
    source: str,
    shape: RecordShape,
    start: Position,
    is_done: IsDone | None = None,
) -> Iterator[Record | BadInput | Skipped]:
    """Records of Arrow record batches (Parquet, HF datasets); `line` is the 1-based row number."""
    row = 0
    for batch in batches:
        if row + batch.num_rows <= start.line:
            row += batch.num_rows  # whole batch already complete: skip without decoding rows
            continue
        for raw in batch.to_pylist():
            row += 1
            if row > start.line:
                item = _record_of(raw, shape, source, row, 0, is_done)
                yield Skipped(row, 0) if item is None else item


def hf_arrow_files(folder: Path, split: str | None = None) -> list[Path]:
    """The Arrow files of a `datasets.save_to_disk` folder (a Dataset, or one split of a DatasetDict)."""
    if (folder / "dataset_dict.json").is_file():
        splits = orjson.loads((folder / "dataset_dict.json").read_bytes()).get("splits", [])
        chosen = split or ("train" if "train" in splits else (splits[0] if splits else ""))
        if chosen not in splits:
            raise InputError(
                f"{folder}: no split {chosen!r}; it has {', '.join(splits) or 'none'}",
                fix="pick one of the splits listed",
            )
        folder = folder / chosen
    state = folder / "state.json"
    if not state.is_file():
        raise InputError(
            f"{folder} is not a `datasets` folder (no state.json)",
            fix="pass a JSONL or Parquet file, or a folder written by Dataset.save_to_disk",
        )
    files = orjson.loads(state.read_bytes()).get("_data_files", [])
    return [folder / item["filename"] for item in files]


def _arrow_batches(files: list[Path]) -> Iterator[pa.RecordBatch]:
    for path in files:
        with pa.memory_map(str(path)) as mapped:
            yield from pa.ipc.open_stream(mapped)


def read_records(
    path: Path,
    shape: RecordShape,
    start: Position = Position(),
    split: str | None = None,
    is_done: IsDone | None = None,
) -> Iterator[Record | BadInput | Skipped]:
    """Stream the records of any supported input, starting after `start`; done ones as `Skipped`."""
    if path.is_dir():
        return read_batches(_arrow_batches(hf_arrow_files(path, split)), str(path), shape, start, is_done)
    if path.suffix == ".parquet":
        try:
            parquet = pq.ParquetFile(str(path))
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(f"cannot read Parquet file {path}: {exc}", fix="check the file") from exc
        return read_batches(parquet.iter_batches(batch_size=BATCH_ROWS), str(path), shape, start, is_done)
    return read_jsonl(path, shape, start, is_done)


def count_records(path: Path, split: str | None = None) -> int:
    """How many records the input holds (JSONL: its lines), for progress totals."""
    if path.is_dir():
        return sum(batch.num_rows for batch in _arrow_batches(hf_arrow_files(path, split)))
    if path.suffix == ".parquet":
        return int(pq.ParquetFile(str(path)).metadata.num_rows)
    count, last = 0, b"\n"
    with _open(path) as handle:
        while chunk := handle.read(1 << 20):  # newlines counted at C speed; blank lines are rare
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def fingerprint(path: Path) -> str:
    """Size and mtime of the input: a resume position is trusted only while the input is unchanged."""
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _open(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(
            f"cannot read the input {path}: {exc.strerror}",
            fix="check the path; inputs are JSONL, Parquet or a datasets folder",
        ) from exc
