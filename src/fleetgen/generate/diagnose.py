"""Why every record of an input is bad: the likely cause, named with its fix.

A job whose first `FAIL_FAST` records are all bad (or whose whole input is bad) stops with an `InputError`
instead of ending "complete": the input is most likely not what the job expects — an archive or a binary
file, text that is not JSON Lines, or records whose prompt is in a field the job does not read (the job
file's `prompt_field` / `id_field` set the names).
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.errors import InputError
from fleetgen.generate.source import hf_arrow_files, open_input
from fleetgen.generate.work import BadInput, RecordShape

FAIL_FAST = 50
NUM_PEEK = 20
PROMPT_LIKE = ("prompt", "question", "instruction", "input", "query", "text", "problem", "content", "user")


def all_bad(path: Path, shape: RecordShape, split: str | None, bad: list[BadInput]) -> InputError:
    """The error for an input whose records read so far are all bad (`bad`: the first, never none)."""
    reasons = Counter(b.reason.split(":")[0] for b in bad)
    where = f"{path} ({len(bad)} record{'s' * (len(bad) != 1)} read, all bad)"
    context: dict[str, object] = {"first bad": f"line {bad[0].line}: {bad[0].reason}"}
    if not path.is_dir() and path.suffix != ".parquet":
        with open_input(path) as handle:  # decompressed: what was parsed
            head = bytes(handle.read(64))
        if reasons.get("malformed JSON", 0) == len(bad) or b"\x00" in head:
            return InputError(
                f"{where}: no line is a JSON object; the file is not JSON Lines",
                context={**context, "first bytes": repr(head[:60])},
                fix="convert it to JSON Lines (one JSON object per line), Parquet or a datasets folder",
            )
    fields = _fields_seen(path, split)
    context["fields seen"] = ", ".join(fields)
    context["expected"] = (
        f"a prompt in {shape.prompt_field!r} (job file: prompt_field) or a chat in 'messages' / "
        f"'conversations'; the id in {shape.id_field!r} (job file: id_field) or none (a content hash)"
    )
    if reasons.get("missing field", 0) * 2 >= len(bad) and fields:
        guess = next((name for name in PROMPT_LIKE if name in fields), fields[0])
        return InputError(
            f"{where}: no record has the fields the job reads — 'messages', 'conversations' or "
            f"{shape.prompt_field!r}",
            context=context,
            fix=f'set prompt_field = "{guess}" in the job file (--job FILE; id_field names the id), or '
            "rename the field in the input",
        )
    return InputError(
        f"{where}: every record is bad (most often: {reasons.most_common(1)[0][0]})",
        context=context,
        fix="fix the records (table inputs_bad lists each with its reason), or point the job at its input",
    )


def _fields_seen(path: Path, split: str | None) -> list[str]:
    """The field names of the first records (Parquet / datasets: the columns)."""
    try:
        if path.is_dir():
            with pa.memory_map(str(hf_arrow_files(path, split)[0])) as mapped:
                return list(pa.ipc.open_stream(mapped).schema.names)
        if path.suffix == ".parquet":
            return list(pq.ParquetFile(str(path)).schema_arrow.names)
        seen: dict[str, None] = {}
        with open_input(path) as handle:
            for line in itertools.islice(handle, NUM_PEEK):
                with contextlib.suppress(orjson.JSONDecodeError):
                    record = orjson.loads(line)
                    seen.update(dict.fromkeys(record if isinstance(record, dict) else ()))
        return list(seen)
    except (OSError, IndexError, EOFError, pa.ArrowException):
        return []
