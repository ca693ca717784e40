"""`generate.export`: stores of every schema version read, the filters and every format."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from fleetgen.errors import JobError
from fleetgen.generate import rows as rowmod
from fleetgen.generate.export import export, filter_sql
from fleetgen.generate.ledger.store import (
    MIGRATIONS,
    Batch,
    Store,
)
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import Completion


def test_export_reads_a_store_written_before_a_column_was_added(tmp_path: Path) -> None:
    """A reader never migrates: a column the folder's schema lacks (here `chash`) reads as NULL."""
    out = tmp_path / "out"
    out.mkdir()
    with sqlite3.connect(out / "results.sqlite") as conn:
        for number, script in enumerate(MIGRATIONS[:2]):
            conn.executescript(f"BEGIN; {script}; PRAGMA user_version = {number + 1}; COMMIT;")
        conn.execute(
            "INSERT INTO results (id, sample, khash, source, line, prompt, content, reasoning_content, "
            "num_turns, finish_reason, is_truncated, is_empty, has_leaked_think, is_repetitive) "
            "VALUES ('old', 0, 1, 'f', 1, ?, 'answer', 'why', 1, 'stop', 0, 0, 0, 0)",
            (orjson.dumps([[{"role": "user", "content": "q"}]]).decode(),),
        )
    summary = export(out, "sharegpt", tmp_path / "sg.jsonl")
    assert summary.rows == 1
    row = orjson.loads((tmp_path / "sg.jsonl").read_bytes())
    assert row["id"] == "old" and row["conversations"][-1]["content"] == "answer"
    with sqlite3.connect(out / "results.sqlite") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2  # untouched


def test_export_filters_and_formats(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "out")
    builder = rowmod.RowBuilder("m", "h")
    batch = Batch()
    for i, (content, finish) in enumerate([("fine answer", "stop"), ("cut", "length"), ("", "stop")]):
        segments = [[{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]]
        work = Work(Record(f"r{i}", "f", i + 1, 0, segments), 0)
        work.done.append(Completion(content, f"reason {i}", finish, 2, 3))
        batch.results.append(builder.result("s0", work, 0.0, 0.1))
    store.write_batch(batch)
    store.close()
    out = tmp_path / "out"
    assert export(out, "jsonl", tmp_path / "all.jsonl").rows == 3
    assert export(out, "jsonl", tmp_path / "c.jsonl", ["clean"]).rows == 1
    assert export(out, "jsonl", tmp_path / "t.jsonl", ["truncated"]).rows == 1
    sharegpt = export(out, "sharegpt", tmp_path / "sg.jsonl", ["no-truncated"])
    assert (sharegpt.rows, sharegpt.skipped) == (1, 1)  # the empty answer is skipped, counted
    row = orjson.loads((tmp_path / "sg.jsonl").read_bytes())
    assert [m["role"] for m in row["conversations"]] == ["system", "user", "assistant"]
    assert row["conversations"][-1]["reasoning_content"] == "reason 0"
    inline = export(out, "sharegpt", tmp_path / "in.jsonl", ["no-truncated"], inline_think=True)
    assert inline.rows == 2  # reasoning inline makes the empty answer non-empty
    first = orjson.loads((tmp_path / "in.jsonl").read_bytes().splitlines()[0])
    assert first["conversations"][-1]["content"] == "<think>\nreason 0\n</think>\n\nfine answer"
    export(out, "openai-batch", tmp_path / "b.jsonl")
    line = orjson.loads((tmp_path / "b.jsonl").read_bytes().splitlines()[1])
    assert line["custom_id"] == "r1:0" and line["response"]["body"]["choices"][0]["finish_reason"] == "length"
    export(out, "parquet", tmp_path / "r.parquet")
    assert pq.read_table(tmp_path / "r.parquet").column("is_truncated").to_pylist() == [False, True, False]
    with pytest.raises(JobError):
        filter_sql(["bogus"])
    assert not list(tmp_path.glob(".*tmp*"))
    with sqlite3.connect(out / "results.sqlite") as conn:  # export only reads
        assert conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 3
