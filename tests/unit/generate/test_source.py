"""Pieces of generation: sources, store, resume position, quality flags, response normalization, export."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.errors import JobError
from fleetgen.generate import rows as rowmod
from fleetgen.generate import source
from fleetgen.generate.export import export, filter_sql
from fleetgen.generate.progress import PositionTracker
from fleetgen.generate.quality import flags_of, has_think_marker, is_repetitive
from fleetgen.generate.source import Position, content_id, read_records
from fleetgen.generate.store import (
    BAD,
    ERRORS,
    MIGRATIONS,
    RESULTS,
    SERIES,
    TABLES,
    BadRow,
    Batch,
    ErrorRow,
    SeriesRow,
    Store,
)
from fleetgen.generate.work import BadInput, Record, RecordShape, Work, key_hash
from fleetgen.http.client import Completion, RequestFailed, parse_completion, parse_event

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
    got = list(read_records(path, SHAPE, Position(), is_done=lambda rid: 0 if rid in done else None))
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
        read_records(path, SHAPE, Position(), is_done=lambda rid: 0 if rid in {"r0", "r1", "r2"} else None)
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


def test_multi_turn_history_uses_the_models_answers() -> None:
    segments = [[{"role": "user", "content": "u1"}], [{"role": "user", "content": "u2"}]]
    work = Work(Record("w", "f", 1, 0, segments), 0)
    work.done.append(Completion("a1", "r1", "stop", 1, 1))
    assert work.messages_for_next_turn() == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
    ]


def test_migrations_apply_once_and_upserts_are_idempotent(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    version = store.conn.execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS)
    work = Work(Record("a", "f", 3, 0, [[{"role": "user", "content": "q"}]]), 0)
    work.done.append(Completion("x", "r", "length", 4, 9))
    row = rowmod.RowBuilder("m", "h").result("s0", work, 0.0, 0.1)
    store.write_batch(Batch(results=[row, row]))
    store.write_batch(Batch(results=[row], meta={"k": "v"}))
    assert store.counts().results == 1 and store.counts().truncated == 1 and store.get_meta("k") == "v"
    assert store.done_keys() == {work.key: 0} and store.done_keys(after_line=3) == {}
    store.close()
    Store.open(tmp_path).close()  # reopening migrates nothing twice


def test_one_writer_per_folder(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    with pytest.raises(JobError, match="another `fleetgen run`"):
        Store.open(tmp_path)
    store.close()


def test_failed_batch_writes_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    good = ErrorRow("a", 0, 1, "f", 1, "http_500", "bad", 500, 1, "s0", 0.0, 7)
    too_short: Any = ("f", 1, None)  # a row the table refuses (too few columns), after a good one
    with pytest.raises(JobError, match="writing results"):
        store.write_batch(Batch(errors=[good], bad=[too_short]))
    assert store.counts().errors == 0
    store.close()


UGLY = ("", "é\x00😀'\"; DROP TABLE results; --", "x" * 100_000)


def test_each_table_holds_exactly_its_record_and_gives_it_back(tmp_path: Path) -> None:
    """A record's fields are its table's columns in order (a migration adding a column adds the field), and
    any record written comes back equal, whatever its text and numbers."""
    store = Store.open(tmp_path)
    for table in TABLES:
        columns = tuple(row[1] for row in store.conn.execute(f"PRAGMA table_info({table.name})"))
        assert columns == table.record._fields, table.name
    builder = rowmod.RowBuilder("m\x00é", "h")
    results, errors = [], []
    for i, text in enumerate(UGLY):  # built as a run builds them: one, two and three turns
        segments = [[{"role": "user", "content": text}]] * (i + 1)
        work = Work(Record(f"r{i}{text}", text, 2**62 + i, 0, segments, content_hash=-(2**63) + i), i)
        work.done.extend(Completion(text, text, "length" if i else "stop", None, 2**40) for _ in range(i + 1))
        results.append(builder.result(text, work, 0.5, 1e-300))
        errors.append(builder.error(text, work, RequestFailed(text, url="u", status=None, is_retryable=True)))
    bad = [BadRow(text, i, None if i else text, text, 0.0) for i, text in enumerate(UGLY)]
    series = [SeriesRow(float(i), text, i, 2**63 - 1, -i, None if i else 2.5) for i, text in enumerate(UGLY)]
    store.write_batch(Batch(results=results, errors=errors, bad=bad, series=series))
    assert list(store.iter_rows(RESULTS)) == results and list(store.iter_rows(ERRORS)) == errors
    assert list(store.iter_rows(BAD)) == bad and list(store.iter_rows(SERIES)) == series
    # Rows are upserted on their key: writing them again adds no row.
    store.write_batch(Batch(results=[r._replace(content="again") for r in results], bad=bad))
    assert [r.content for r in store.iter_rows(RESULTS)] == ["again"] * 3 and store.counts().bad_inputs == 3
    assert store.counts().errors == 0  # a result replaces the error row of its key (--retry-errors)
    store.close()


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


def test_position_moves_only_past_fully_committed_lines() -> None:
    tracker = PositionTracker(Position())
    tracker.open(1, 10, 2)
    tracker.open(2, 20, 0)  # already done: no rows owed
    tracker.open(3, 30, 1)
    tracker.paid(3)
    tracker.advance()
    assert tracker.position == Position()  # line 1 still owes rows
    tracker.paid(1)
    tracker.paid(1)
    tracker.advance()
    assert tracker.position == Position(3, 30)


def test_quality_flags() -> None:
    loop = "I think the answer is maybe " * 80
    assert is_repetitive(loop) and is_repetitive("好" * 3000)
    prose = " ".join(f"word{i} said something new about item {i * 7 % 13}" for i in range(200))
    assert not is_repetitive(prose) and not is_repetitive("short")
    flags = flags_of(Completion("<think>x</think> ans", "", "length", 1, 1))
    assert flags.is_truncated and flags.has_leaked_think and not flags.is_empty
    assert flags_of(Completion("  ", "r", "stop", 1, 1)).is_empty and has_think_marker("a</THINK>")


def _body(message: dict[str, Any], finish: Any = "stop", usage: Any = None) -> bytes:
    return orjson.dumps({"choices": [{"message": message, "finish_reason": finish}], "usage": usage})


def test_completions_normalize_across_engines() -> None:
    vllm = parse_completion(
        _body({"content": "a", "reasoning": "r"}, usage={"prompt_tokens": 3, "completion_tokens": 4}), "u"
    )
    sglang = parse_completion(_body({"content": "a", "reasoning_content": "r"}, {"type": "length"}), "u")
    assert (vllm.reasoning_content, vllm.prompt_tokens, vllm.completion_tokens) == ("r", 3, 4)
    assert (sglang.reasoning_content, sglang.finish_reason, sglang.prompt_tokens) == ("r", "length", None)
    empty = parse_completion(_body({"content": None}, None), "u")
    assert (empty.content, empty.reasoning_content, empty.finish_reason) == ("", "", "unknown")
    with pytest.raises(RequestFailed) as aborted:
        parse_completion(_body({"content": ""}, "abort"), "u")
    assert aborted.value.is_retryable
    with pytest.raises(RequestFailed):
        parse_completion(b"<html>", "u")


def test_stream_events_normalize_across_engines() -> None:
    vllm = parse_event({"choices": [{"delta": {"reasoning": "r"}}]})
    sglang = parse_event({"choices": [{"delta": {"reasoning_content": "r", "content": None}}]})
    assert vllm == sglang and (vllm.reasoning_content, vllm.content, vllm.has_text) == ("r", "", True)
    last = parse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": None}})
    assert (last.prompt_tokens, last.completion_tokens, last.has_text) == (3, 0, False)
    role = parse_event({"choices": [{"delta": {"role": "assistant"}}], "usage": None})
    assert not role.has_text and role.completion_tokens is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=9), inner, max_size=3),
    max_leaves=8,
)


@given(
    event=JSON | st.fixed_dictionaries({"choices": st.lists(JSON, max_size=2), "usage": JSON}),
    delta=st.dictionaries(st.sampled_from(["content", "reasoning", "reasoning_content", "role"]), JSON),
)
def test_any_stream_event_reads_without_raising(event: Any, delta: dict[str, Any]) -> None:
    """A server's odd event is an event without text, never a crash of the sweep."""
    assert isinstance(parse_event(event).content + parse_event(event).reasoning_content, str)
    texts = [v for k, v in delta.items() if k != "role"]
    read = parse_event({"choices": [{"delta": delta}]})
    if all(isinstance(v, str) or v is None for v in texts):
        assert read.has_text == any(texts)


def test_failure_kinds() -> None:
    text = "HTTP 400: This model's maximum context length is 2048 tokens"
    too_long = RequestFailed(text, url="u", status=400, is_retryable=False)
    assert too_long.kind == "prompt_too_long"
    assert RequestFailed("x", url="u", is_retryable=True, is_connection=True).kind == "connection"


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
