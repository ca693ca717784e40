"""Input records, streamed: JSONL (plain, or gzip / zstd / bz2 / xz compressed, recognised by their first
bytes whatever the file is called), Parquet, or a local Hugging Face `datasets` folder (its Arrow files).

Each record becomes the segments of a `Work` item (see `work.py`) or a `BadInput` naming file, line and
reason. Memory does not grow with the dataset; a resume `Position` starts a rerun past the complete prefix.
Which turns the model writes and how a conversation is normalised (README "Input shapes"): every assistant
turn is a placeholder the model regenerates, in order, on its own earlier answers; the system and user turns
are the context, merged the way trainers and chat templates take them. The id comes from a configurable
field, else a stable hash of the record's canonical JSON.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from fleetgen.errors import InputError, InputMismatch
from fleetgen.generate.work import BadInput, Record, RecordShape, text_of
from fleetgen.http.request import Message

# Roles by the names chat formats give them (ShareGPT: human / gpt).
ROLE_OF = {"human": "user", "user": "user", "system": "system"}
ROLE_OF |= dict.fromkeys(("gpt", "assistant", "chatgpt", "model", "bot"), "assistant")
BATCH_ROWS = 1024
MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}
ARCHIVES = {
    b"PK\x03\x04": "a zip archive",
    b"7z\xbc\xaf": "a 7z archive",
    b"Rar!": "a rar archive",
    b"PAR1": "a Parquet file without the .parquet suffix",
    b"ARROW1": "an Arrow file",
    b"SQLite format 3": "an SQLite database",
}


@dataclass(frozen=True, slots=True)
class Position:
    """Where reading resumes: the last complete line number and, for JSONL, the byte offset after it."""

    line: int = 0
    offset: int = 0


# `is_done(record id, line)`: the content hash stored with the record read at that line when all its work is
# done there (0: unknown, rows written before content hashes were stored); else None, and the record is read
# whole (the ledger's intake judges it: work, a duplicate, or an input that changed). A record done at its
# own line with other content is an error.
IsDone = Callable[[str, int], int | None]
# A run of records `is_done` says are done is yielded as the `Position` after its last one: one per run of
# consecutive done records (at most `SKIP_RUN` lines), not one per record, so a resume that passes over a
# million done records costs a JSON parse and a key lookup each, nothing more.
SKIP_RUN = 65536


def content_id(record: dict[str, Any]) -> str:
    """A stable id from the record's canonical JSON (sorted keys): the same record → the same id."""
    canonical = orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return "h" + hashlib.blake2b(canonical, digest_size=12).hexdigest()


def content_hash(segments: list[list[Message]]) -> int:
    """A stable signed 64-bit hash of what a record sends (its segments): the same prompt → the same hash."""
    digest = hashlib.blake2b(orjson.dumps(segments, option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1  # 0 means "not known"


def to_segments(record: dict[str, Any], shape: RecordShape) -> list[list[Message]] | str:
    """The turn segments of a record, or the reason it cannot be used."""
    if "messages" in record:
        segments = _from_turns(record["messages"], "messages")
    elif "conversations" in record:
        segments = _from_turns(record["conversations"], "conversations")
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


def _join(first: Any, second: Any) -> Any:
    """Two consecutive turns of one role as one: strings joined by a blank line, else their parts."""
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    return [*_parts(first), *_parts(second)]


def _parts(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _from_turns(turns: object, field: str) -> list[list[Message]] | str:
    """Segments of a conversation (see the module docstring for the rules per shape)."""
    if not isinstance(turns, list) or not turns:
        return f"empty {field}: {field!r} must be a non-empty list"
    segments: list[list[Message]] = []
    pending: list[Message] = []  # system/user turns since the last answer
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"{field} turn {index} is not an object"
        speaker = turn.get("role", turn.get("from"))
        role = ROLE_OF.get(str(speaker).lower())
        if role is None:
            return f"{field} turn {index} has unsupported role {speaker!r} (user, assistant, leading system)"
        if role == "assistant":
            if pending and pending[-1]["role"] == "user":
                segments.append(pending)
                pending = []
            continue  # the model writes its own answers; one before any user turn has no question: dropped
        text = turn.get("content", turn.get("value"))
        if not text_of(text).strip():
            return f"{field} turn {index} ({role}) has empty or missing text"
        if role == "system" and (segments or any(m["role"] == "user" for m in pending)):
            return (
                f"{field} turn {index} is a system message after the conversation started: trainers and chat "
                "templates take one only at the start (move it there or drop it)"
            )
        if pending and pending[-1]["role"] == role:
            pending[-1]["content"] = _join(pending[-1]["content"], text)
        else:
            pending.append({"role": role, "content": text})
    if pending and pending[-1]["role"] == "user":
        segments.append(pending)
    return segments or f"no user turn in {field!r}"


def _record_of(
    raw: object, shape: RecordShape, source: str, line: int, end: int, is_done: IsDone | None = None
) -> Record | BadInput | None:
    """The record on a line; None when `is_done` says it is done with the same content."""
    if not isinstance(raw, dict):
        return BadInput(source, line, f"expected a JSON object, got {type(raw).__name__}", None, end)
    given = raw.get(shape.id_field)
    record_id = str(given) if given not in (None, "") else content_id(raw)  # else the hash of its content
    stored = is_done(record_id, line) if is_done is not None else None
    if stored == 0:
        return None  # done before content hashes were stored: nothing to compare
    segments = to_segments(raw, shape)
    if stored is None:
        if isinstance(segments, str):
            return BadInput(source, line, segments, record_id, end)
        return Record(record_id, source, line, end, segments, content_hash(segments))
    if isinstance(segments, str) or content_hash(segments) != stored:
        raise conflict(record_id, source, line)
    return None


def conflict(record_id: str, source: str, line: int) -> InputMismatch:
    """The error for a record whose id is stored with other content (never a silent skip)."""
    return InputMismatch(
        f"record {record_id!r} ({source}:{line}) is already stored with other content: the input changed "
        "since that record was generated (its stored answer belongs to another prompt)",
        fix="write this input to another folder (-o), or give changed records new ids",
    )


def read_jsonl(
    path: Path, shape: RecordShape, start: Position, is_done: IsDone | None = None
) -> Iterator[Record | BadInput | Position]:
    """Records of a JSONL file from `start`; a malformed line becomes `BadInput`; blank lines are skipped;
    runs of records `is_done` says are done become one `Position`."""
    source = str(path)
    with open_input(path) as handle:
        _seek(handle, start.offset)
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
                    yield Position(line, offset)
                continue
            if num_skipped:
                num_skipped = 0
                yield Position(line - 1, offset - len(raw))  # the run ends on the line before this one
            yield item
        if num_skipped:
            yield Position(line, offset)


def read_batches(
    batches: Iterator[pa.RecordBatch],
    source: str,
    shape: RecordShape,
    start: Position,
    is_done: IsDone | None = None,
) -> Iterator[Record | BadInput | Position]:
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
                yield Position(row, 0) if item is None else item


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
) -> Iterator[Record | BadInput | Position]:
    """Stream the records of any supported input, starting after `start`; done ones as `Position`s."""
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
    with open_input(path) as handle:
        while chunk := handle.read(1 << 20):  # newlines counted at C speed; blank lines are rare
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def input_files(path: Path, split: str | None = None) -> list[Path]:
    """The files an input reads: the file itself, or a `datasets` folder's Arrow files."""
    return hf_arrow_files(path, split) if path.is_dir() else [path]


def compression_of(path: Path) -> str | None:
    """The compression of a file from its first bytes (gzip, zstd, bz2, xz), None for a plain file.

    An archive or another binary format is refused here, before a line of it is read as JSON."""
    with open_raw(path) as handle:
        head = handle.read(16)
    kind = next((name for magic, name in ARCHIVES.items() if head.startswith(magic)), None)
    if kind is not None:
        raise InputError(
            f"{path} is {kind}, not JSON Lines",
            fix="extract it (a Parquet file: name it .parquet); fleetgen reads JSONL plain or compressed "
            "with gzip, zstd, bz2 or xz directly",
        )
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)


def open_input(path: Path) -> Any:
    """A binary line reader over the input, decompressed when it is compressed (seek: decompressed bytes)."""
    kind = compression_of(path)
    if kind is None:
        return open_raw(path)
    if kind == "zstd":
        reader = zstandard.ZstdDecompressor().stream_reader(open_raw(path), read_across_frames=True)
        return io.BufferedReader(reader)
    if kind == "gzip":
        return gzip.open(path, "rb")
    return bz2.open(path, "rb") if kind == "bz2" else lzma.open(path, "rb")


def _seek(handle: Any, offset: int) -> None:
    """Move to `offset`; a compressed stream that cannot seek is read (decompressed) up to it."""
    if handle.seekable():
        handle.seek(offset)
        return
    while offset > 0 and (chunk := handle.read(min(offset, 1 << 20))):
        offset -= len(chunk)


def open_raw(path: Path) -> Any:
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(
            f"cannot read the input {path}: {exc.strerror}",
            fix="check the path; inputs are JSONL (plain or .gz/.zst/.bz2/.xz), Parquet or a datasets folder",
        ) from exc
