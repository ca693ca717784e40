"""Measure a job's shape (`plan.job.JobShape`) on its own input, and output lengths on an earlier run's store.

The input is read by `run`'s own reader (`source.read_records`, the job file's fields and system prompt), and
each request's prompt is what `run` sends (`Work.messages_for_next_turn`, the model's earlier answers aside:
they are not written yet). Prompt tokens are counted with the model's `tokenizer.json` where the folder has
one (the `tokenizers` library), else estimated from the text's UTF-8 bytes; `JobShape.counted_with` says
which. The chat template is not rendered (that needs jinja2, which fleetgen does not carry): a fixed frame
per message stands in for it, the size ChatML and Llama 3 give it.

Records are sampled uniformly over the whole input (reservoir sampling, seeded), and the longest records by
text are counted too, so the context the job needs is not a sample's accident. That is one pass over the
input, as `run` reads it (a few seconds per million short records).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
import sqlite3
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from tokenizers import Tokenizer

from fleetgen.config import JobFile
from fleetgen.errors import InputError, JobError
from fleetgen.generate.diagnose import FAIL_FAST, all_bad
from fleetgen.generate.forced import Filler, filler_for
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.source import read_records
from fleetgen.generate.work import BadInput, Record, RecordShape, text_of
from fleetgen.http.request import Message
from fleetgen.plan.job import (
    EmpiricalLengths,
    JobShape,
    LengthStats,
    LogNormalLengths,
    OutputLengths,
    expected_output,
)

# The chat template's frame, in tokens: ChatML's `<|im_start|>role\n … <|im_end|>\n` and Llama 3's
# `<|start_header_id|>role<|end_header_id|>\n\n … <|eot_id|>` are 5 a message; the reply's opening
# (`<|im_start|>assistant\n<think>\n`) about as many.
PER_MESSAGE_TOKENS = 5
REPLY_OPENING_TOKENS = 5
# Without the tokenizer: UTF-8 bytes per token (English BPE ~4 characters a token; CJK ~1–1.5 characters of
# 3 bytes). Also the width of a token id in a packed prompt, so a packed prompt is 4 bytes a token either way.
BYTES_PER_TOKEN = 4
NUM_LONGEST = 8  # the longest records by text, counted for the context the job needs
ROLE_CODE = {"system": 1, "user": 2}  # in a message's frame: no token id (< 2^24) nor UTF-8 has 0xFF bytes


@dataclass(frozen=True)
class Counter:
    """How prompts become comparable, countable bytes: token ids (4 bytes each, big-endian) or UTF-8 text.
    `unit`: the bytes of one comparable unit (a shared prefix ends on a whole one)."""

    encode: Callable[[list[str]], list[bytes]]
    unit: int
    counted_with: str
    is_estimate: bool

    def pack(self, prompts: list[list[Message]]) -> list[bytes]:
        """Each prompt as its messages' frames and texts, one batch through the encoder."""
        texts = self.encode([text_of(m["content"]) for prompt in prompts for m in prompt])
        packed, position = [], 0
        for prompt in prompts:
            parts = []
            for message in prompt:
                frame = bytes((0xFF, 0xFF, 0xFF, ROLE_CODE.get(message["role"], 3)))
                parts += [frame * PER_MESSAGE_TOKENS, texts[position]]
                position += 1
            packed.append(b"".join(parts))
        return packed

    def tokens(self, text: str) -> int:
        """The tokens of `text` as the model's tokenizer counts them (only where one was read)."""
        assert not self.is_estimate, "an estimate counts bytes, not tokens"
        return len(self.encode([text])[0]) // BYTES_PER_TOKEN


def tokens_of(packed: bytes) -> int:
    """The prompt tokens of a packed prompt, the reply's opening included."""
    return math.ceil(len(packed) / BYTES_PER_TOKEN) + REPLY_OPENING_TOKENS


def counter_for(tokenizer_dir: Path | None) -> Counter:
    """The model's tokenizer where `tokenizer_dir` has a loadable `tokenizer.json`, else the estimate (its
    `counted_with` says why)."""
    frame = f"{PER_MESSAGE_TOKENS} tokens a message and {REPLY_OPENING_TOKENS} for the reply's opening"
    estimate = f"estimate: {BYTES_PER_TOKEN} bytes of UTF-8 text per token, {frame}"
    if tokenizer_dir is None:
        return _estimate(f"{estimate} (no model folder to read a tokenizer from)")
    path = tokenizer_dir / "tokenizer.json"
    if not path.is_file():
        return _estimate(f"{estimate} (no tokenizer.json in {tokenizer_dir})")
    try:
        tokenizer = _tokenizer(str(path), path.stat().st_mtime_ns)
    except Exception as exc:  # the library raises plain Exception (e.g. a newer format than it reads)
        return _estimate(f"{estimate} ({path} does not load: {exc})")

    def encode(texts: list[str]) -> list[bytes]:
        encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
        return [struct.pack(f">{len(e.ids)}I", *e.ids) for e in encodings]

    chat = f"{frame} (its chat template not rendered)"
    return Counter(encode, BYTES_PER_TOKEN, f"the model's tokenizer ({path}), {chat}", is_estimate=False)


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, _modified_ns: int) -> Tokenizer:
    """A tokenizer file loaded once per version (tune counts the job's prompts, then its filler, with it:
    a 248k-entry vocabulary takes seconds to load)."""
    return Tokenizer.from_file(path)


def filler_of(tokenizer_dir: Path | None) -> Filler:
    """The steady start's filler (`generate.forced`), counted with the model's tokenizer where it is
    readable, else assumed (and said so)."""
    counter = counter_for(tokenizer_dir)
    if counter.is_estimate:
        return Filler(counted_with=f"assumed one token: {counter.counted_with}")
    return filler_for(counter.tokens, f"counted with {tokenizer_dir}/tokenizer.json")


def _estimate(counted_with: str) -> Counter:
    def encode(texts: list[str]) -> list[bytes]:
        return [text.encode("utf-8", "surrogatepass") for text in texts]

    return Counter(encode, 1, counted_with, is_estimate=True)


def shared_prefix_tokens(packed: list[bytes], unit: int) -> float:
    """Tokens per prompt that a prefix cache holding the others finds computed: the prompts' total minus
    their prefix tree's size (in sorted order, the sum of each one's common prefix with the one before)."""
    ordered = sorted(packed)
    shared = sum(_common_prefix(a, b) // unit * unit for a, b in itertools.pairwise(ordered))
    return shared / BYTES_PER_TOKEN / len(packed) if packed else 0.0


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of `a` and `b` (binary search over C-speed comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if a[:middle] == b[:middle] else (low, middle - 1)
    return low


def turn_prompts(record: Record) -> list[list[Message]]:
    """The prompt of each request a record makes: turn k's is every segment up to k (answers not counted)."""
    return [[m for segment in record.segments[: k + 1] for m in segment] for k in range(len(record.segments))]


@dataclass
class Scan:
    """One pass over the input: a uniform sample of good records, the longest by text, what was bad."""

    sampled: list[Record] = field(default_factory=list)
    # (text length, order read, record): a min-heap of the NUM_LONGEST longest
    longest: list[tuple[int, int, Record]] = field(default_factory=list)
    first_bad: list[BadInput] = field(default_factory=list)  # the first FAIL_FAST, for `diagnose.all_bad`
    num_read: int = 0
    num_bad: int = 0
    max_turns: int = 0


def scan(items: Iterable[object], size: int, rng: random.Random) -> Scan:
    """Reservoir-sample `size` records of `items` (Algorithm R), keeping the longest and the first bad."""
    seen, num_good = Scan(), 0
    for item in items:
        if isinstance(item, BadInput):
            seen.num_read, seen.num_bad = seen.num_read + 1, seen.num_bad + 1
            if len(seen.first_bad) < FAIL_FAST:
                seen.first_bad.append(item)
        if not isinstance(item, Record):
            continue
        seen.num_read, num_good = seen.num_read + 1, num_good + 1
        seen.max_turns = max(seen.max_turns, len(item.segments))
        if len(seen.sampled) < size:
            seen.sampled.append(item)
        elif (slot := rng.randrange(num_good)) < size:
            seen.sampled[slot] = item
        length = sum(len(text_of(m["content"])) for segment in item.segments for m in segment)
        heapq.heappush(seen.longest, (length, num_good, item))
        if len(seen.longest) > NUM_LONGEST:
            heapq.heappop(seen.longest)
    return seen


def read_job_shape(
    job_file: JobFile,
    input_path: Path,
    *,
    tokenizer_dir: Path | None,
    output_lengths: OutputLengths | None,
    sample: int = 2000,
    seed: int = 0,
    split: str | None = None,
) -> JobShape:
    """The shape of `job_file` over `input_path` (read as `run` reads it, `split` of a datasets folder
    included): `sample` records drawn uniformly (seeded) and the longest ones, counted with `tokenizer_dir`'s
    tokenizer where it has one; output lengths from `output_lengths`, else `max_tokens` as the ceiling."""
    output, output_from = expected_output(output_lengths, job_file.max_tokens)  # refused before the long read
    shape = RecordShape.of(job_file)
    seen = scan(read_records(input_path, shape, split=split), sample, random.Random(seed))
    if not seen.sampled:
        if seen.first_bad:
            raise all_bad(input_path, shape, split, seen.first_bad)
        raise InputError(
            f"{input_path} holds no records to measure the job on",
            fix="point the job at its input: JSONL (plain or compressed), Parquet or a datasets folder",
        )
    counter = counter_for(tokenizer_dir)
    packed = counter.pack([prompt for record in seen.sampled for prompt in turn_prompts(record)])
    longest = counter.pack([turn_prompts(record)[-1] for _, _, record in seen.longest])
    return JobShape(
        prompt_tokens=LengthStats.of([tokens_of(p) for p in packed]),
        output_tokens=output,
        output_from=output_from,
        is_output_ceiling=output_lengths is None,
        max_tokens=job_file.max_tokens,
        samples=job_file.samples,
        thinking=job_file.thinking,
        shared_prefix_tokens=shared_prefix_tokens(packed, counter.unit),
        counted_with=counter.counted_with,
        is_estimate=counter.is_estimate,
        records_sampled=len(seen.sampled),
        records_read=seen.num_read,
        records_bad=seen.num_bad,
        longest_prompt_tokens=max(map(tokens_of, longest)),
        max_turns=seen.max_turns,
        max_length=job_file.max_length,
    )


def output_lengths_from_store(folder: Path) -> EmpiricalLengths:
    """The output lengths an earlier run's folder holds: each request's completion tokens (a multi-turn row,
    each turn's), truncated ones included (they are what max_tokens let through)."""
    store = Store.open(folder, writer=False)
    lengths: list[int] = []
    query = "SELECT num_turns, completion_tokens, turns FROM results WHERE completion_tokens > 0"
    try:
        for num_turns, tokens, turns in store.conn.execute(query):
            if num_turns > 1 and turns:
                lengths += [t["completion_tokens"] for t in orjson.loads(turns) if t.get("completion_tokens")]
            else:
                lengths.append(int(tokens))
    except sqlite3.Error as exc:
        raise JobError(
            f"cannot read {store.path}: {exc}", fix="pass a folder `fleetgen run -o` wrote"
        ) from exc
    finally:
        store.close()
    if not lengths:
        raise InputError(
            f"{folder} holds no completed requests with token counts to take output lengths from",
            fix="point at a folder a `fleetgen run` has written completions to, or give the lengths as "
            "mean=…,min=…,max=…",
        )
    return EmpiricalLengths(tuple(lengths), f"{len(lengths):,} completions in {folder}")


def output_lengths_of(given: str) -> OutputLengths:
    """`--output-lengths`: an earlier run's output folder (its completions' lengths), else a spec such as
    `mean=1800,min=300,max=6000`."""
    path = Path(given).expanduser()
    return output_lengths_from_store(path) if path.is_dir() else LogNormalLengths.parse(given)
