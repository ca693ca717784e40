"""Measuring a job on its input (`generate.jobshape`): real files in every format `run` reads, real
tokenizers (a word-level one built here, whose counts are known exactly; the repo's tiny Qwen3-style model
when it is built), a real store written by a run."""

from __future__ import annotations

import gzip
import itertools
import math
import os
import random
import statistics
from pathlib import Path
from typing import Any

import datasets
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from fleetgen.config import JobFile
from fleetgen.errors import InputError, JobError
from fleetgen.generate.jobshape import (
    PER_MESSAGE_TOKENS,
    REPLY_OPENING_TOKENS,
    counter_for,
    filler_of,
    output_lengths_from_store,
    read_job_shape,
    scan,
    shared_prefix_tokens,
)
from fleetgen.generate.ledger.store import Batch, ResultRow, Store
from fleetgen.generate.work import Record
from fleetgen.plan.job import LogNormalLengths
from tests.fixtures import skip_or_fail
from tests.fixtures.jobs import new_job, write_jsonl
from tests.fixtures.standin import StandIn, serve
from tests.fixtures.vllm import default_tiny_model_dir

VOCABULARY = "the a fleet model token prompt answer cache batch gpu system you are helpful why how"
WORDS = tuple(VOCABULARY.split())
FRAME = PER_MESSAGE_TOKENS  # tokens a message's frame adds


def word_tokenizer(folder: Path) -> Path:
    """A real `tokenizers` tokenizer.json whose tokens are the whitespace-separated words: exact counts."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate(["[UNK]", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def expected_prompts(record: dict[str, Any], system: str | None) -> list[int]:
    """Tokens of each request a record makes, counted independently: words, frames, the reply's opening."""
    turns = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
    context: list[str] = [system] if system and turns[0]["role"] != "system" else []
    counts = []
    for turn in turns:
        if turn["role"] == "assistant":
            continue
        context.append(turn["content"])
        if turn["role"] == "user":
            counts.append(sum(FRAME + len(text.split()) for text in context) + REPLY_OPENING_TOKENS)
    return counts


sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join)


@st.composite
def records(draw: st.DrawFn, index: int = 0) -> dict[str, Any]:
    """A prompt record, or a conversation (optional system turn, alternating user and assistant)."""
    if draw(st.booleans()):
        return {"prompt": draw(sentences)}
    turns: list[dict[str, str]] = (
        [{"role": "system", "content": draw(sentences)}] if draw(st.booleans()) else []
    )
    for _ in range(draw(st.integers(1, 3))):
        turns += [{"role": "user", "content": draw(sentences)}, {"role": "assistant", "content": "x"}]
    return {"messages": turns if draw(st.booleans()) else turns[:-1]}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(records(), min_size=1, max_size=40), st.one_of(st.none(), sentences), st.integers(1, 9000))
def test_counts_each_request_as_run_sends_it_and_the_context_holds_every_one(
    tmp_path_factory: pytest.TempPathFactory, batch: list[dict[str, Any]], system: str | None, max_tokens: int
) -> None:
    """Invariant: prompt tokens are each request's words and frames (the job's system prompt, every turn
    before it); the context the job needs holds every prompt and its answers; the shared prefix is at
    most the mean prompt."""
    tmp = tmp_path_factory.mktemp("j")
    path = write_jsonl(tmp / "in.jsonl", [{"id": str(i), **r} for i, r in enumerate(batch)])
    job = JobFile(max_tokens=max_tokens, system_prompt=system)
    shape = read_job_shape(job, path, tokenizer_dir=word_tokenizer(tmp / "m"), output_lengths=None)
    per_record = [expected_prompts(r, system) for r in batch]
    prompts = [n for counts in per_record for n in counts]
    assert not shape.is_estimate and shape.prompt_tokens.count == len(prompts)
    assert shape.prompt_tokens.max == max(prompts) == shape.longest_prompt_tokens
    assert shape.prompt_tokens.mean == pytest.approx(sum(prompts) / len(prompts))
    assert shape.max_turns == max(map(len, per_record))
    for counts in per_record:
        assert shape.context_tokens >= counts[-1] + len(counts) * max_tokens
    assert 0 <= shape.shared_prefix_tokens <= shape.prompt_tokens.mean - REPLY_OPENING_TOKENS
    assert shape.records_sampled == shape.records_read == len(batch) and shape.records_bad == 0
    assert shape.is_output_ceiling and shape.output_tokens.mean == max_tokens


def prefix_tree_size(sequences: list[bytes], unit: int) -> int:
    """An independent count: the distinct non-empty prefixes (in whole units) of `sequences`."""
    return len({s[:k] for s in sequences for k in range(unit, len(s) + 1, unit)})


@given(st.lists(st.binary(max_size=24), min_size=1, max_size=12), st.sampled_from([1, 4]))
def test_shared_prefix_is_what_a_prefix_tree_saves(raw: list[bytes], unit: int) -> None:
    """Invariant: the shared tokens are the total minus the prefix tree's size, never more than a prompt's
    own length on average, whatever the prompts."""
    packed = [s[: len(s) // unit * unit] for s in raw]  # whole units, as packed prompts are
    shared = shared_prefix_tokens(packed, unit)
    total = sum(len(s) for s in packed)
    shared_units = total // unit - prefix_tree_size(packed, unit)
    assert shared == pytest.approx(shared_units * unit / 4 / len(packed))
    assert 0 <= shared <= total / 4 / len(packed)


def test_identical_prompts_share_all_but_the_first_and_disjoint_ones_only_the_frame(tmp_path: Path) -> None:
    folder = word_tokenizer(tmp_path / "m")
    same = write_jsonl(
        tmp_path / "same.jsonl", [{"id": str(i), "prompt": "why the cache"} for i in range(10)]
    )
    shape = read_job_shape(JobFile(), same, tokenizer_dir=folder, output_lengths=None)
    assert shape.shared_prefix_tokens == pytest.approx(9 / 10 * (FRAME + 3))
    disjoint = [{"id": w, "prompt": f"{w} gpu batch"} for w in WORDS[:10]]
    shape = read_job_shape(
        JobFile(), write_jsonl(tmp_path / "d.jsonl", disjoint), tokenizer_dir=folder, output_lengths=None
    )
    assert shape.shared_prefix_tokens == pytest.approx(9 / 10 * FRAME)  # the user frame, nothing more
    assert shared_prefix_tokens([b"abcd", b"bbcd", b"cbcd"], 1) == 0  # no frame: nothing shared


def test_how_tokens_were_counted_is_said_and_flagged(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "why the fleet"}])  # 13 bytes
    job = JobFile()
    no_folder = read_job_shape(job, path, tokenizer_dir=None, output_lengths=None)
    assert no_folder.is_estimate and no_folder.counted_with.startswith("estimate: 4 bytes")
    assert "no model folder" in no_folder.counted_with
    assert no_folder.prompt_tokens.max == math.ceil((4 * FRAME + 13) / 4) + REPLY_OPENING_TOKENS
    (tmp_path / "bare").mkdir()
    bare = read_job_shape(job, path, tokenizer_dir=tmp_path / "bare", output_lengths=None)
    assert bare.is_estimate and f"no tokenizer.json in {tmp_path / 'bare'}" in bare.counted_with
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text('{"model": "from the future"}')
    broken = read_job_shape(job, path, tokenizer_dir=tmp_path / "broken", output_lengths=None)
    assert broken.is_estimate and "does not load" in broken.counted_with
    real = read_job_shape(job, path, tokenizer_dir=word_tokenizer(tmp_path / "m"), output_lengths=None)
    assert not real.is_estimate and str(tmp_path / "m" / "tokenizer.json") in real.counted_with
    assert real.prompt_tokens.max == FRAME + 3 + REPLY_OPENING_TOKENS


def test_the_tiny_models_tokenizer_counts_its_chat_template_exactly(tmp_path: Path) -> None:
    """With the repo's tiny Qwen3-style model (scripts/build_tiny_model.py): the count is the length of the
    prompt its ChatML template renders (user turns; `system` is several tokens in its small vocabulary)."""
    model = default_tiny_model_dir()
    if not (model / "tokenizer.json").is_file():
        skip_or_fail("the tiny model", f"no tokenizer.json at {model}: run scripts/build_tiny_model.py")
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    texts = ["Explain how a radix cache saves prefill.", "Why?", "Write a function that adds two numbers."]
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": t} for t in texts])
    shape = read_job_shape(JobFile(), path, tokenizer_dir=model, output_lengths=None)
    rendered = [f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n<think>\n" for t in texts]
    counts = sorted(len(tokenizer.encode(r, add_special_tokens=False).ids) for r in rendered)
    assert (shape.prompt_tokens.p50, shape.prompt_tokens.max) == (counts[1], counts[2])
    assert shape.prompt_tokens.mean == pytest.approx(sum(counts) / 3) and not shape.is_estimate


def test_every_input_format_run_reads_measures_alike(tmp_path: Path) -> None:
    data = {"id": [f"r{i}" for i in range(30)], "question": [" ".join(WORDS[: i % 9 + 1]) for i in range(30)]}
    rows = [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]
    write_jsonl(tmp_path / "in.jsonl", rows)
    (tmp_path / "in.jsonl.gz").write_bytes(gzip.compress((tmp_path / "in.jsonl").read_bytes()))
    pq.write_table(pa.table(data), tmp_path / "in.parquet")
    datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / "ds"))
    job, folder = (
        JobFile(prompt_field="question", system_prompt="you are helpful"),
        word_tokenizer(tmp_path / "m"),
    )
    shapes = [
        read_job_shape(job, tmp_path / name, tokenizer_dir=folder, output_lengths=None)
        for name in ("in.jsonl", "in.jsonl.gz", "in.parquet", "ds")
    ]
    assert all(s == shapes[0] for s in shapes)
    assert shapes[0].prompt_tokens.max == 2 * FRAME + 3 + 9 + REPLY_OPENING_TOKENS  # system prompt counted
    assert shapes[0].shared_prefix_tokens > FRAME + 3  # the system prompt is shared


def test_bad_records_are_counted_and_an_input_of_only_bad_ones_is_named(tmp_path: Path) -> None:
    mixed = [{"prompt": "why"}, b"{not json", {"question": "how"}, {"prompt": "the gpu"}, {"prompt": ""}]
    path = write_jsonl(tmp_path / "mixed.jsonl", mixed)
    shape = read_job_shape(JobFile(), path, tokenizer_dir=None, output_lengths=None)
    assert (shape.records_read, shape.records_bad, shape.records_sampled) == (5, 3, 2)
    wrong_field = write_jsonl(tmp_path / "q.jsonl", [{"question": f"q{i}"} for i in range(5)])
    with pytest.raises(InputError) as caught:
        read_job_shape(JobFile(), wrong_field, tokenizer_dir=None, output_lengths=None)
    assert (
        'prompt_field = "question"' in caught.value.fix and "5 records read, all bad" in caught.value.message
    )
    (tmp_path / "empty.jsonl").write_bytes(b"\n\n")
    with pytest.raises(InputError) as caught:
        read_job_shape(JobFile(), tmp_path / "empty.jsonl", tokenizer_dir=None, output_lengths=None)
    assert "holds no records" in caught.value.message


def test_a_sample_of_a_long_input_is_seeded_and_its_longest_record_still_counts(tmp_path: Path) -> None:
    lines = [{"id": str(i), "prompt": " ".join(WORDS[: i % 5 + 1])} for i in range(300)]
    lines[173]["prompt"] = " ".join(WORDS * 20)  # the longest by far
    path, folder = write_jsonl(tmp_path / "in.jsonl", lines), word_tokenizer(tmp_path / "m")
    shapes = [
        read_job_shape(JobFile(), path, tokenizer_dir=folder, output_lengths=None, sample=10, seed=seed)
        for seed in (3, 3, 4)
    ]
    assert shapes[0] == shapes[1] and shapes[0].records_sampled == 10 and shapes[0].records_read == 300
    longest = FRAME + 20 * len(WORDS) + REPLY_OPENING_TOKENS
    assert all(s.longest_prompt_tokens == longest for s in shapes)
    assert all(s.context_tokens == longest + 4096 for s in shapes)
    assert any(s.prompt_tokens.max < longest for s in shapes)  # the sample alone would have missed it


def test_output_lengths_given_are_the_expected_output_and_refused_past_max_tokens(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "why"}])
    lengths = LogNormalLengths.parse("mean=1800,min=300,max=6000")
    shape = read_job_shape(JobFile(max_tokens=8192), path, tokenizer_dir=None, output_lengths=lengths)
    assert shape.output_tokens == lengths.stats and not shape.is_output_ceiling
    assert shape.kv_tokens_per_request == shape.prompt_tokens.mean + 1800
    with pytest.raises(Exception, match="max_tokens 4096"):
        read_job_shape(JobFile(), path, tokenizer_dir=None, output_lengths=lengths)


def result(i: int, completion_tokens: int | None, turns: list[int] | None = None) -> ResultRow:
    """A results row as `run` writes it; `turns`: each turn's completion tokens (a multi-turn record)."""
    each = [
        {"content": "a", "reasoning_content": "", "finish_reason": "stop", "completion_tokens": n}
        for n in turns or []
    ]
    row: dict[str, Any] = {name: 0 for name in ResultRow._fields} | {"prompt": "[]", "content": "a"}
    row |= {
        "id": f"r{i}",
        "khash": i + 1,
        "line": i + 1,
        "num_turns": len(turns or [1]),
        "finish_reason": "stop",
    }
    row |= {"completion_tokens": completion_tokens, "turns": orjson.dumps(each).decode() if turns else None}
    return ResultRow(**row)


def test_output_lengths_of_a_store_are_its_requests_lengths(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "out")
    batch = Batch(results=[result(0, 700), result(1, None), result(2, 0), result(3, 30 + 40, [30, 40])])
    store.write_batch(batch)
    store.close()
    lengths = output_lengths_from_store(tmp_path / "out")
    assert sorted(lengths.values) == [30, 40, 700]  # each turn is a request; unknown counts left out
    assert lengths.source == f"3 completions in {tmp_path / 'out'}"
    Store.open(tmp_path / "empty").close()
    with pytest.raises(InputError) as caught:
        output_lengths_from_store(tmp_path / "empty")
    assert "no completed requests" in caught.value.message and "mean=" in caught.value.fix
    with pytest.raises(JobError, match="holds no results"):
        output_lengths_from_store(tmp_path / "nothing")


async def test_output_lengths_of_a_real_run(tmp_path: Path) -> None:
    """A store `run` wrote (the stand-in answers 5 tokens a turn): one length per request, each turn's."""
    turns = [
        {"role": r, "content": f"q{i}"} for i, r in zip(range(3), itertools.cycle(["user", "assistant"]))
    ]
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "messages": turns}, {"id": "b", "prompt": "q"}])
    async with serve(StandIn()) as server:
        await new_job(tmp_path, prompts, [server.url]).run()
    assert output_lengths_from_store(tmp_path / "out").values == (5, 5, 5)


def test_the_sample_is_uniform_over_the_input() -> None:
    """Reservoir sampling: every record as likely to be drawn, the first as the last (the mean position of
    200 drawn of 2,000 is the input's middle, within 4 standard errors; seeded, so reproducible)."""
    items = [Record(str(i), "in", i, 0, [[{"role": "user", "content": "x" * (i % 97)}]]) for i in range(2000)]
    seen = scan(items, 200, random.Random(11))
    positions = [record.line for record in seen.sampled]
    assert len(set(positions)) == 200 and seen.num_read == 2000
    assert abs(statistics.fmean(positions) - 999.5) < 4 * 577 / math.sqrt(200)
    assert sorted(length for length, _, _ in seen.longest) == [96] * 8  # the longest texts kept


def test_the_steady_starts_filler_is_counted_by_the_models_tokenizer_or_said_assumed(tmp_path: Path) -> None:
    assumed = filler_of(None)
    assert assumed.is_assumed and "no model folder" in assumed.counted_with
    folder = word_tokenizer(tmp_path / "m")  # whitespace words: " the" is [UNK], one token each
    measured = filler_of(folder)
    assert not measured.is_assumed and str(folder / "tokenizer.json") in measured.counted_with
    assert measured.unit_tokens == 1


def test_a_tokenizer_file_is_read_once_per_version(tmp_path: Path) -> None:
    """tune counts the prompts, then the filler, with one tokenizer: loaded once; a tokenizer.json replaced
    in between (another model's) is read again, and counts as the new one does."""
    folder = word_tokenizer(tmp_path / "m")
    before = counter_for(folder)
    assert counter_for(folder).tokens("hello world") == before.tokens("hello world") == 2
    path = folder / "tokenizer.json"
    one = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))  # whole text one unknown token
    one.save(str(path))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert counter_for(folder).tokens("hello world") == 1
