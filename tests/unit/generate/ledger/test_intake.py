"""A job where every record is bad is not "complete": it stops early naming the likely cause, and a run that
produced nothing useful never ends "complete" (the CLI exits non-zero). Compressed JSONL is read directly.

Filed under `generate/intake.py` (fail-fast on all-bad input), with `diagnose.py`'s causes, `source.py`'s
compressed input, and the exit codes of `fleetgen run` and `export` when nothing useful came out."""

from __future__ import annotations

import asyncio
import bz2
import dataclasses
import gzip
import lzma
import sqlite3
import sys
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgen.errors import InputError
from fleetgen.generate.diagnose import FAIL_FAST
from fleetgen.generate.work import RecordShape
from tests.fixtures.jobs import FAST, new_job, write_jsonl
from tests.fixtures.standin import StandIn, serve

COMPRESS = {
    "gz": gzip.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


def jsonl(records: list[Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(sorted(COMPRESS)),
    name=st.sampled_from(["p.jsonl.{kind}", "p.jsonl", "p.txt"]),
    num=st.integers(1, 30),
)
async def test_compressed_input_gives_the_rows_the_plain_file_gives(
    tmp_path_factory: pytest.TempPathFactory, kind: str, name: str, num: int
) -> None:
    """Invariant: gzip / zstd / bz2 / xz JSONL, whatever its name, yields the same results as the plain file
    (and resumes: a rerun sends nothing)."""
    tmp = tmp_path_factory.mktemp("c")
    records = [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(num)]
    path = tmp / name.format(kind=kind)
    path.write_bytes(COMPRESS[kind](jsonl(records)))
    async with serve(StandIn()) as a:
        summary = await new_job(tmp, path, [a.url]).run()
        a.seen.clear()
        again = await new_job(tmp, path, [a.url]).run()
    assert summary.status == "complete" and summary.results == num and summary.bad_inputs == 0
    assert again.completions_this_run == 0 and not a.seen


async def test_a_wrong_field_name_stops_after_the_first_records_and_names_the_job_file_key(
    tmp_path: Path,
) -> None:
    prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"id": i, "question": f"q{i}"} for i in range(FAIL_FAST * 20)]
    )
    async with serve(StandIn()) as a:
        with pytest.raises(InputError) as err:
            await new_job(tmp_path, prompts, [a.url]).run()
        assert not a.seen
        with sqlite3.connect(tmp_path / "out" / "results.sqlite") as conn:
            assert conn.execute("SELECT COUNT(*) FROM inputs_bad").fetchone()[0] <= FAIL_FAST  # stopped early
        text = str(err.value)
        assert (
            "question" in text
            and 'prompt_field = "question"' in err.value.fix
            and "job file" in err.value.fix
        )
        assert err.value.exit_code == 2  # the input is wrong (README: exit 2), not the fleet
        # Fixed job file, same folder: it starts (nothing had been generated).
        fixed = await new_job(tmp_path, prompts, [a.url], shape=RecordShape(prompt_field="question")).run()
    assert fixed.status == "complete" and fixed.results == FAIL_FAST * 20 and fixed.bad_inputs == 0


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b"PK\x03\x04" + b"\x00" * 200, "zip archive"),
        (b"PAR1" + b"\x00" * 200, "Parquet file without the .parquet suffix"),
        (b"id,prompt\n" + b"".join(b"%d,question %d\n" % (i, i) for i in range(80)), "not JSON Lines"),
        (b"\x00\x01\x02garbage\n" * 5, "not JSON Lines"),
        (jsonl([{"text": "a"}, {"text": "b"}, {"text": "c"}]), 'prompt_field = "text"'),  # a short input
        (jsonl([{"prompt": ""}] * 3 + [[1, 2]]), "every record is bad"),
    ],
)
async def test_an_input_whose_every_record_is_bad_is_an_error_naming_the_cause(
    tmp_path: Path, content: bytes, cause: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(content)
    async with serve(StandIn()) as a:
        with pytest.raises(InputError) as err:
            await new_job(tmp_path, path, [a.url]).run()
    assert cause in str(err.value) + err.value.fix


async def test_a_real_zip_of_jsonl_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("p.jsonl", jsonl([{"prompt": f"q{i}"} for i in range(100)]))
    async with serve(StandIn()) as a:
        with pytest.raises(InputError, match="zip archive"):
            await new_job(tmp_path, path, [a.url]).run()


async def test_a_run_that_produced_nothing_is_failed_not_complete(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i} [[sim:status=500]]"} for i in range(2)])
    once = dataclasses.replace(FAST, max_retries=1)
    async with serve(StandIn()) as a:
        nothing = await new_job(tmp_path, empty, [a.url], out_dir=tmp_path / "o1").run()
        all_errors = await new_job(tmp_path, prompts, [a.url], out_dir=tmp_path / "o2", policy=once).run()
    assert nothing.status == "failed" and all_errors.status == "failed" and all_errors.errors == 2


async def test_bad_records_among_good_ones_do_not_stop_the_job(tmp_path: Path) -> None:
    records: list[Any] = [{"question": "x"}] * (FAIL_FAST - 1) + [{"prompt": "q"}] + [{"question": "y"}] * 100
    prompts = write_jsonl(tmp_path / "p.jsonl", records)
    async with serve(StandIn()) as a:
        summary = await new_job(tmp_path, prompts, [a.url]).run()
    assert summary.status == "complete" and summary.results == 1 and summary.bad_inputs == FAIL_FAST + 99


async def cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from fleetgen.cli import main; main()",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return int(proc.returncode or 0), (out + err).decode()


async def test_the_cli_never_exits_0_when_nothing_useful_was_produced(tmp_path: Path) -> None:
    gz_as_text = tmp_path / "p.jsonl"
    gz_as_text.write_bytes(gzip.compress(jsonl([{"question": f"q{i}"} for i in range(200)])))
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    async with serve(StandIn()) as a:
        base = ["--endpoint", a.url, "--no-live"]
        wrong_field = await cli("run", str(gz_as_text), "-o", str(tmp_path / "o1"), *base)
        nothing = await cli("run", str(empty), "-o", str(tmp_path / "o2"), *base)
    assert wrong_field[0] == 2 and 'prompt_field = "question"' in wrong_field[1]  # wrong input: 2
    assert nothing[0] == 1 and "no result" in nothing[1]  # README: ends `failed`, exit 1, never 0


async def test_an_export_that_wrote_nothing_exits_non_zero_with_the_reasons(tmp_path: Path) -> None:
    prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": f"q{i} [[sim:finish=length:empty]]"} for i in range(3)]
    )
    async with serve(StandIn()) as a:
        await new_job(tmp_path, prompts, [a.url]).run()
    code, text = await cli(
        "export", str(tmp_path / "out"), "--format", "sharegpt", "--to", str(tmp_path / "t.jsonl")
    )
    assert code == 1 and "wrote 0 rows" in text and "dropped 3: empty assistant answer" in text
    assert "3 truncated rows dropped" in text


async def test_parquet_and_datasets_with_the_wrong_column_name_are_named(tmp_path: Path) -> None:
    import datasets  # a dev dependency (pyproject): missing, the test fails; imported here, it is slow

    data = {"instruction": [f"q{i}" for i in range(FAIL_FAST + 5)]}
    pq.write_table(pa.table(data), tmp_path / "p.parquet")
    datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / "ds"))
    async with serve(StandIn()) as a:
        for name in ("p.parquet", "ds"):
            with pytest.raises(InputError) as err:
                await new_job(tmp_path, tmp_path / name, [a.url], out_dir=tmp_path / f"o-{name}").run()
            assert 'prompt_field = "instruction"' in err.value.fix, name
            assert "instruction" in str(err.value.context["fields seen"])
