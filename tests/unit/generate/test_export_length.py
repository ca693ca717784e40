"""`export --max-length`: for any store, the counts are exact against what the store holds (rows over, trained
tokens past the limit, rows cut, rows dropped), the rows written are the trainer's cut (their first N tokens)
or gone; and every export's sidecar (`<file>.meta.json`) says what the rows are. Also `generate.export_meta`
and `plan.throughput.max_length_issue`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgen.chattemplate import ModelTokens
from fleetgen.errors import JobError
from fleetgen.generate.export import export
from fleetgen.generate.export_meta import sidecar_path
from fleetgen.generate.export_tally import PAST_MAX_LENGTH
from fleetgen.generate.ledger.store import Batch, Store
from fleetgen.generate.modelfiles import keep_model
from fleetgen.generate.rows import RowBuilder
from fleetgen.generate.work import Record, Work
from fleetgen.http.client import Completion
from tests.fixtures.chatml import chatml_folder, special_id

WORDS = ["the", " fox", " over", " dog", " again", " café", " 🙂"]
# per row: (prompt words, answer words, finished)
ROWS = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 40), st.booleans()), min_size=1, max_size=12)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chatml_folder(tmp_path_factory.mktemp("model"))


def write_store(out: Path, model: Path, shapes: list[tuple[int, int, bool]]) -> list[dict[str, Any]]:
    """A job's store whose rows carry the engine's ids (a user prompt of n words, an answer of m words, the
    end-of-sequence id where it stopped), as `run` writes it; returns each row's (length, trained tokens)."""
    tokens = ModelTokens(model / "tokenizer.json")
    store = Store.open(out)
    recorded = keep_model(store, model, thinking=True)  # what `run` records when it starts
    store.set_meta({key: json.dumps(value) for key, value in recorded.items()})
    store.set_meta({"params": json.dumps({"thinking": True, "max_tokens": 64})})
    builder, batch, expected = RowBuilder("m", "h"), Batch(), []
    header = tokens.encode("<|im_start|>assistant\n<think>\n")
    for i, (num_prompt, num_answer, finished) in enumerate(shapes):
        user = "".join(WORDS[k % len(WORDS)] for k in range(num_prompt)) or "q"
        prompt = [*tokens.encode(f"<|im_start|>user\n{user}<|im_end|>\n"), *header]
        output = [tokens.encode(WORDS[k % len(WORDS)])[0] for k in range(num_answer)]
        output += [special_id("<|im_end|>")] if finished else []
        work = Work(Record(f"r{i}", "in.jsonl", i + 1, 0, [[{"role": "user", "content": user}]]), 0)
        finish = "stop" if finished else "length"
        work.done.append(Completion("x", "why", finish, len(prompt), len(output), prompt, output))
        batch.results.append(builder.result("s0", work, 0.0, 0.1))
        closing = 1 if finished else 0  # the newline the template puts after <|im_end|>
        length = len(prompt) + len(output) + closing
        # trained: "<think>\n" (2 tokens of the prompt), the answer, its end of turn; an open turn that
        # ends in a newline (no answer yet) keeps it out (SpecForge's `$` matches before a final newline)
        trained_to = length - (not finished and not output)
        expected.append({"length": length, "trained_from": len(prompt) - 2, "trained_to": trained_to})
    store.write_batch(batch)
    store.close()
    return expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=ROWS, limit=st.integers(1, 60), drop=st.booleans())
def test_max_length_counts_are_exact_against_the_store(
    tmp_path_factory: pytest.TempPathFactory,
    model: Path,
    shapes: list[tuple[int, int, bool]],
    limit: int,
    drop: bool,
) -> None:
    tmp = tmp_path_factory.mktemp("job")
    expected = write_store(tmp / "out", model, shapes)
    path = tmp / "tokens.jsonl"
    summary = export(
        tmp / "out", "specforge-tokens", path, max_length=limit, over_length="drop" if drop else "cut"
    )
    over = [e for e in expected if e["length"] > limit]
    past = sum(max(0, e["trained_to"] - max(limit, e["trained_from"])) for e in over)
    assert summary.over_max_length == len(over)
    assert summary.loss_tokens_past_max_length == past
    nothing_left = [e for e in over if min(e["trained_to"], limit) <= e["trained_from"]]
    if drop:
        assert summary.dropped.get(PAST_MAX_LENGTH, 0) == len(over) and summary.cut_at_max_length == 0
    else:
        assert summary.cut_at_max_length == len(over) - len(nothing_left)
    assert summary.rows + summary.skipped == len(expected)
    written = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) <= limit and any(r["loss_mask"]) for r in written)
    meta = json.loads(sidecar_path(path).read_text())
    assert meta["counts"]["over_max_length"] == len(over) and meta["counts"]["rows"] == summary.rows


def test_the_sidecar_says_what_the_rows_are(tmp_path: Path, model: Path) -> None:
    write_store(tmp_path / "out", model, [(3, 5, True), (2, 70, False)])
    store = Store.open(tmp_path / "out")
    store.set_meta(
        {
            "fleet": json.dumps({"kind": "sglang", "version": "0.5.23", "model": "/models/q"}),
            "engine_args": json.dumps({"reasoning-parser": "qwen3"}),
            "input_identity": json.dumps({"kind": "jsonl", "path": "in.jsonl"}),
        }
    )
    store.close()
    for fmt in ("jsonl", "sharegpt", "specforge-tokens"):
        path = tmp_path / f"x.{fmt}"
        summary = export(tmp_path / "out", fmt, path, max_length=40 if fmt != "jsonl" else None)
        meta = json.loads(sidecar_path(path).read_text())
        assert meta["format"] == fmt and meta["file"] == path.name
        assert meta["engine"] == {
            "kind": "sglang",
            "release": "0.5.23",
            "model": "/models/q",
            "args": {"reasoning-parser": "qwen3"},
            "endpoints": None,
        }
        assert meta["model"] == {"m": summary.rows} and meta["thinking"] is True
        assert meta["input"]["identity"] == {"kind": "jsonl", "path": "in.jsonl"}
        recorded, used = meta["chat_template"]["recorded"], meta["chat_template"]["used"]
        assert recorded["source"] == str(model / "tokenizer_config.json") and recorded["thinking"] is True
        assert used is None if fmt == "jsonl" else used["sha256"] == recorded["sha256"]
        assert meta["counts"]["rows"] == summary.rows and meta["counts"]["truncated_written"] == 1
    assert (
        meta["counts"]["over_max_length"] == 1
        and meta["chat_template"]["used"]["end_of_turn"] == "<|im_end|>\n"
    )


def test_max_length_is_refused_on_a_format_no_trainer_reads(tmp_path: Path, model: Path) -> None:
    write_store(tmp_path / "out", model, [(1, 1, True)])
    with pytest.raises(JobError, match="not a training format"):
        export(tmp_path / "out", "parquet", tmp_path / "x.parquet", max_length=10)
