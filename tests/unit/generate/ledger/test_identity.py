"""A folder is one job: the input's identity is checked before any request, a stored id with other content is
an error (never a silent skip), and a file with records appended still resumes by a seek.

Attacked with the inputs that mixed datasets before: another file with the same ids, another split of a
content-hash dataset, another `datasets` folder or Parquet file with the same mtime, a changed model or
sampling params, and a record edited in place.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fleetgen.errors import InputMismatch, ParamsMismatch
from fleetgen.generate.ledger import identity
from fleetgen.generate.source import ARCHIVES
from fleetgen.generate.work import RecordShape
from tests.fixtures.jobs import new_job, options, params, rows, write_jsonl
from tests.fixtures.standin import StandIn, serve

SHAPE = RecordShape()


def same_mtime(path: Path, like: Path) -> None:
    stat = like.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.binary(max_size=3000), second=st.binary(max_size=3000))
def test_a_file_is_its_input_or_that_input_with_records_appended(
    tmp_path: Path, first: bytes, second: bytes
) -> None:
    """Invariant: another file is refused; the same file with bytes appended is the same input."""
    assume(not any((first + second).startswith(m) or second.startswith(m) for m in ARCHIVES))  # refused
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(first)
    b.write_bytes(second)
    stored = identity.identify(a, None, SHAPE)
    same_mtime(b, a)
    diffs = identity.differences(stored, b, identity.identify(b, None, SHAPE))
    assert (diffs == []) == second.startswith(first)
    b.write_bytes(first + second)
    assert identity.differences(stored, b, identity.identify(b, None, SHAPE)) == []


def test_a_large_file_that_differs_where_sampled_is_another_input(tmp_path: Path) -> None:
    data = bytearray(orjson.dumps({"prompt": "x" * 100}) + b"\n") * 20000  # ~2 MB
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(data)
    stored = identity.identify(a, None, SHAPE)
    for where in (0, len(data) * 8 // 17 + 10, len(data) - 2):  # the head, a sampled block, the tail
        changed = bytearray(data)
        changed[where] ^= 1
        b.write_bytes(changed)
        assert identity.differences(stored, b, identity.identify(b, None, SHAPE)), where


async def test_another_file_with_the_same_ids_is_refused_before_any_request(tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", [{"id": f"r{i}", "prompt": f"old {i}"} for i in range(20)])
    other = write_jsonl(tmp_path / "b.jsonl", [{"id": f"r{i}", "prompt": f"new {i}"} for i in range(20)])
    same_mtime(other, first)
    async with serve(StandIn()) as a:
        await new_job(tmp_path, first, [a.url]).run()
        a.seen.clear()
        with pytest.raises(InputMismatch) as err:
            await new_job(tmp_path, other, [a.url]).run()
        assert not a.seen  # refused before a single request
    assert "another input" in err.value.message and "-o" in err.value.fix and "--add-input" in err.value.fix
    assert str(first.resolve()) in str(err.value)


async def test_another_split_of_a_content_hash_dataset_is_refused(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}"} for i in range(30)])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": f"q{i}"} for i in range(10, 40)])
    async with serve(StandIn()) as a:
        await new_job(tmp_path, train, [a.url]).run()
        with pytest.raises(InputMismatch):
            await new_job(tmp_path, test, [a.url]).run()


async def test_datasets_folders_and_parquet_with_the_same_mtime_are_other_inputs(tmp_path: Path) -> None:
    import datasets  # a dev dependency (pyproject): missing, the test fails; imported here, it is slow

    for i in (1, 2):
        data = {"id": [f"d{k}" for k in range(8)], "prompt": [f"v{i} {k}" for k in range(8)]}
        datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / f"ds{i}"))
        pq.write_table(pa.table(data), tmp_path / f"p{i}.parquet")
    same_mtime(tmp_path / "ds2", tmp_path / "ds1")
    async with serve(StandIn()) as a:
        for first, second in (("ds1", "ds2"), ("p1.parquet", "p2.parquet")):
            out = tmp_path / f"out-{first}"
            await new_job(tmp_path, tmp_path / first, [a.url], out_dir=out).run()
            a.seen.clear()
            again = await new_job(tmp_path, tmp_path / first, [a.url], out_dir=out).run()
            assert again.completions_this_run == 0 and not a.seen  # the same input resumes
            with pytest.raises(InputMismatch):
                await new_job(tmp_path, tmp_path / second, [a.url], out_dir=out).run()


async def test_a_changed_model_or_sampling_params_is_refused(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q"}])
    async with serve(StandIn()) as a:
        await new_job(tmp_path, prompts, [a.url]).run()
        for changed in (params(model="another-model"), params(top_p=0.5), params(samples=2)):
            with pytest.raises(ParamsMismatch):
                await new_job(tmp_path, prompts, [a.url], params=changed).run()


async def test_appended_records_resume_by_a_seek_and_only_they_are_sent(tmp_path: Path) -> None:
    records: list[Any] = [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(30)]
    prompts = write_jsonl(tmp_path / "p.jsonl", records)
    async with serve(StandIn()) as a:
        await new_job(tmp_path, prompts, [a.url]).run()
        with prompts.open("ab") as handle:
            handle.write(
                b"".join(orjson.dumps({"id": f"r{i}", "prompt": f"q{i}"}) + b"\n" for i in range(30, 35))
            )
        saved = orjson.loads(rows(tmp_path / "out", "SELECT value FROM meta WHERE key = 'position'")[0][0])
        stored = orjson.loads(
            rows(tmp_path / "out", "SELECT value FROM meta WHERE key = 'input_identity'")[0][0]
        )
        now = identity.check(orjson.dumps(stored).decode(), options(tmp_path, prompts, shape=SHAPE))
        check = identity.ResumeCheck(prompts, now, None)
        assert check.trusts(saved) and saved["line"] == 30  # the done prefix is not re-read
        a.seen.clear()
        again = await new_job(tmp_path, prompts, [a.url]).run()
    assert again.completions_this_run == 5 and sorted(a.seen) == [f"q{i}" for i in range(30, 35)]


async def test_an_added_input_skips_stored_records_and_refuses_stored_ids_with_another_prompt(
    tmp_path: Path,
) -> None:
    """With --add-input every record is checked against the store: the same id and the same prompt is done,
    the same id with another prompt is a bad-input row naming it (the stored answer keeps its own prompt)."""
    first = write_jsonl(tmp_path / "a.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(10)])
    more = write_jsonl(tmp_path / "b.jsonl", [{"id": "r3", "prompt": "q3"}, {"id": "r10", "prompt": "q10"}])
    edited = write_jsonl(
        tmp_path / "c.jsonl", [{"id": "r11", "prompt": "q11"}, {"id": "r4", "prompt": "NEW"}]
    )
    async with serve(StandIn()) as a:
        await new_job(tmp_path, first, [a.url]).run()
        a.seen.clear()
        added = await new_job(tmp_path, more, [a.url], add_input=True).run()
        assert added.completions_this_run == 1 and list(a.seen) == ["q10"]
        a.seen.clear()
        again = await new_job(tmp_path, edited, [a.url], add_input=True).run()
        assert list(a.seen) == ["q11"] and again.status == "complete"
    with sqlite3.connect(tmp_path / "out" / "results.sqlite") as conn:
        (prompt,) = conn.execute("SELECT prompt FROM results WHERE id = 'r4'").fetchone()
        bad = conn.execute("SELECT line, reason, input_index FROM inputs_bad").fetchall()
        indexes = dict(conn.execute("SELECT id, input_index FROM results WHERE id IN ('r3', 'r10', 'r11')"))
    assert "NEW" not in prompt  # the stored answer still belongs to its own prompt
    assert bad == [(2, "id 'r4' is stored from an earlier input of this folder with another prompt", 2)]
    assert indexes == {"r3": 0, "r10": 1, "r11": 2}


async def test_an_in_place_edit_past_the_sampled_bytes_is_caught_on_resume(tmp_path: Path) -> None:
    """The identity samples a large file; an edit elsewhere changes its mtime, the prefix no longer hashes as
    saved, the rerun re-reads the input, and the edited record's stored id is refused."""
    records = [{"id": f"r{i:05d}", "prompt": f"question {i:05d} " + "x" * 60} for i in range(3000)]
    prompts = write_jsonl(tmp_path / "p.jsonl", records)
    data = prompts.read_bytes()
    async with serve(StandIn()) as a:
        await new_job(tmp_path, prompts, [a.url], concurrency=64).run()
        where = data.index(b"question 01001") + len("question 01001 ")
        stored = identity.identify(prompts, None, SHAPE)
        prompts.write_bytes(data[:where] + b"y" + data[where + 1 :])
        assert identity.differences(stored, prompts, identity.identify(prompts, None, SHAPE)) == []
        with pytest.raises(InputMismatch) as err:
            await new_job(tmp_path, prompts, [a.url]).run()
    assert "'r01001'" in err.value.message
