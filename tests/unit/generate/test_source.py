"""`generate.source`: JSONL, Parquet and `datasets` folders read as records, bad lines, resume offsets, ids.

Once part of test_generate_units.py ("pieces of generation"), split by module: the other pieces are
test_work.py, test_store.py, test_export.py, test_progress.py, test_quality.py and
tests/unit/http/test_client.py.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetgen.generate import source
from fleetgen.generate.source import Position, content_id, read_records
from fleetgen.generate.work import BadInput, Record, RecordShape, key_hash

SHAPE = RecordShape()


def records(path: Path, start: Position | None = None) -> list[Record | BadInput | Position]:
    return list(read_records(path, SHAPE, start or Position()))


def only_records(items: list[Record | BadInput | Position]) -> list[Record]:
    """`items`, asserted to hold records only."""
    assert all(isinstance(r, Record) for r in items), items
    return [r for r in items if isinstance(r, Record)]


def test_jsonl_records_bad_lines_and_resume_offset(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": 1, "prompt": "a"}\n\n{oops\n{"prompt": "b"}\n[1]\n')
    got = records(path)
    assert [type(r).__name__ for r in got] == ["Record", "BadInput", "Record", "BadInput"]
    first, bad, second, arr = got
    assert isinstance(first, Record) and first.record_id == "1" and first.line == 1
    assert isinstance(bad, BadInput) and bad.line == 3 and bad.reason.startswith("malformed JSON")
    assert isinstance(second, Record) and second.record_id == content_id({"prompt": "b"})
    assert isinstance(arr, BadInput) and "expected a JSON object" in arr.reason
    resumed = records(path, Position(second.line, second.end_offset))
    assert [r.line for r in resumed] == [5]


def test_done_records_are_skipped_in_runs_that_keep_their_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume passes over done records by id alone, one `Position` per run, bad lines kept in order."""
    lines = [orjson.dumps({"id": f"r{i}", "prompt": f"q{i}"}) for i in range(10)]
    lines[3] = b"{oops"
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ends = [sum(len(line) + 1 for line in lines[: k + 1]) for k in range(10)]  # offset after line k + 1
    done = {"r0", "r1", "r2", "r4", "r5", "r7", "r8", "r9"}
    got = list(read_records(path, SHAPE, Position(), is_done=lambda rid, _line: 0 if rid in done else None))
    assert [type(r).__name__ for r in got] == ["Position", "BadInput", "Position", "Record", "Position"]
    assert (
        got[0] == Position(3, ends[2]) and got[2] == Position(6, ends[5]) and got[4] == Position(10, ends[9])
    )
    assert isinstance(got[1], BadInput) and got[1].line == 4
    assert isinstance(got[3], Record) and (got[3].record_id, got[3].line) == ("r6", 7)
    # Reading on from a skipped run's Position gives exactly what follows it.
    assert isinstance(got[2], Position)
    after = list(read_records(path, SHAPE, got[2]))
    assert [r.line for r in after] == [7, 8, 9, 10]
    # A long run is reported every SKIP_RUN lines, so the resume position keeps moving.
    monkeypatch.setattr(source, "SKIP_RUN", 2)
    runs = list(
        read_records(
            path, SHAPE, Position(), is_done=lambda rid, _line: 0 if rid in {"r0", "r1", "r2"} else None
        )
    )
    assert runs[:2] == [Position(2, ends[1]), Position(3, ends[2])] and isinstance(runs[2], BadInput)


def test_content_id_is_stable_and_key_order_free() -> None:
    assert content_id({"a": 1, "b": [2]}) == content_id({"b": [2], "a": 1}) != content_id({"a": 2, "b": [2]})
    assert key_hash("x", 0) == key_hash("x", 0) != key_hash("x", 1)


def test_shapes_messages_conversations_prompt_and_problems(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [
        {"id": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "old"}]},
        {
            "id": "c",
            "conversations": [
                {"role": "user", "content": "u1"},
                {"from": "gpt", "value": "x"},
                {"role": "user", "content": "u2"},
            ],
        },
        {"id": "e", "messages": []},
        {"id": "n"},
        {"id": "s", "conversations": [{"from": "alien", "value": "x"}]},
    ]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    m, c, e, n, s = records(path)
    assert isinstance(m, Record) and m.segments == [
        [{"role": "user", "content": "q"}]
    ]  # trailing answer dropped
    assert isinstance(c, Record) and [[x["content"] for x in seg] for seg in c.segments] == [["u1"], ["u2"]]
    assert isinstance(e, BadInput) and e.reason.startswith("empty messages") and e.record_id == "e"
    assert isinstance(n, BadInput) and n.reason.startswith("missing field")
    assert isinstance(s, BadInput) and "unsupported role" in s.reason


def test_parquet_and_datasets_folder_stream_with_resume(tmp_path: Path) -> None:
    table = pa.table({"id": [f"p{i}" for i in range(5000)], "prompt": [f"q{i}" for i in range(5000)]})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=1000)
    got = only_records(records(tmp_path / "in.parquet", Position(4998, 0)))
    assert [(r.record_id, r.line) for r in got] == [("p4998", 4999), ("p4999", 5000)]
    import datasets  # a dev dependency (pyproject): missing, the test fails; imported here, it is slow

    datasets.Dataset.from_dict({"id": ["d0", "d1"], "prompt": ["x", "y"]}).save_to_disk(str(tmp_path / "ds"))
    assert [r.record_id for r in only_records(records(tmp_path / "ds"))] == ["d0", "d1"]
