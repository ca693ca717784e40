"""The values of a generation job: input records and their work items, bad input, sampling params, options.

A `Work` item is one (record, sample). The record's `segments` are the message lists to send turn by turn:
turn k is requested with `segments[0] + answer[0] + … + segments[k]`, so a multi-turn conversation is
regenerated on the model's own history. A single-turn record has one segment.

Sampling params are stored with the job; as a request samples they are `SamplingParams.sampling`.
`JobOptions` holds the record shape, the retry policy and the rest of a run's own settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import orjson

from fleetgen.config import JobFile
from fleetgen.generate.forced import Filler
from fleetgen.http.client import Completion
from fleetgen.http.request import Message, Sampling
from fleetgen.plan.job import OutputLengths


def key_hash(record_id: str, sample: int) -> int:
    """A stable signed 64-bit key for (record id, sample): compact enough to hold millions in a set.

    Collisions are possible in principle (about 3e-8 for a million keys); the exact key (id, sample) is
    still the store's primary key, so a collision can only make resume skip, never duplicate.
    """
    digest = hashlib.blake2b(f"{record_id}\x1f{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def id_key(record_id: str) -> int:
    """A stable signed 64-bit key for a record id, whatever its samples: which record owns the id."""
    return key_hash(record_id, -1)


def text_of(content: object) -> str:
    """The text of a turn's content: a string, or the text parts of a list of parts (OpenAI's shape)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


@dataclass(frozen=True, slots=True)
class Record:
    """One good input record, ready to become work (one `Work` per sample); `segments` as sent."""

    record_id: str
    source: str
    line: int
    end_offset: int
    segments: list[list[Message]]
    content_hash: int = 0  # of `segments` (source.content_hash): stored with each row


def changes(old: Mapping[str, Any], new: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """`key: old → new` for every one of `keys` whose value differs."""
    return [f"{key}: {old.get(key)!r} → {new.get(key)!r}" for key in keys if old.get(key) != new.get(key)]


@dataclass(slots=True)
class Work:
    """One (record, sample) to generate. `done` keeps finished turns so a retry resumes at the failed turn."""

    record: Record
    sample: int
    key: int = 0
    attempts: int = 0
    done: list[Completion] = field(default_factory=list)
    number: int = -1  # its place in the dispatcher's send order (generate/rejects.py); kept by its retries

    def __post_init__(self) -> None:
        if not self.key:
            self.key = key_hash(self.record.record_id, self.sample)

    def messages_for_next_turn(self) -> list[Message]:
        """The history for the next turn: every earlier segment followed by the model's own answer."""
        segments, history = self.record.segments, []
        for k, answer in enumerate(self.done):
            history.extend(segments[k])
            history.append({"role": "assistant", "content": answer.content})
        history.extend(segments[len(self.done)])
        return history

    @property
    def is_finished(self) -> bool:
        return len(self.done) == len(self.record.segments)


@dataclass(frozen=True, slots=True)
class BadInput:
    """An input record that cannot become work: named by file and line, with the reason."""

    source: str
    line: int
    reason: str
    record_id: str | None = None
    end_offset: int = 0


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What decides the text a model writes. Stored with the job; resuming with others is refused."""

    model: str | None
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    seed: int | None
    samples: int
    thinking: bool
    system_prompt: str | None
    extra_body: dict[str, Any]

    @classmethod
    def of(cls, job_file: JobFile) -> SamplingParams:
        """A job file's sampling settings (with the command line's flags over it: `JobFile.overridden`)."""
        return cls(**job_file.model_dump(include={f.name for f in fields(cls)}))

    def to_json(self) -> str:
        return orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS).decode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def differences(self, other: dict[str, Any], *, ignore: frozenset[str] = frozenset()) -> list[str]:
        """`name: stored → now` for every param that differs from `other` (a stored `to_json()`, decoded)."""
        mine = asdict(self)
        return changes(other, mine, sorted((set(mine) | set(other)) - ignore))

    @property
    def sampling(self) -> Sampling:
        """How every request of the job samples (`fleetgen.http.request` builds the bodies; `bench --job`
        takes this too). Reasoning comes back apart, whatever the engine (`separate_reasoning`)."""
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            thinking=self.thinking,
            separate_reasoning=True,
            seed=self.seed,
            extra_body=self.extra_body,
        )


@dataclass(frozen=True, slots=True)
class RecordShape:
    """How to read records: which field holds the id and which the prompt; an optional system prompt."""

    id_field: str = "id"
    prompt_field: str = "prompt"
    system_prompt: str | None = None

    @classmethod
    def of(cls, job_file: JobFile) -> RecordShape:
        """How a job file says its records read (`run` and `read_job_shape` alike)."""
        return cls(job_file.id_field, job_file.prompt_field, job_file.system_prompt)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Defaults suit days-long jobs; tests shorten the waits."""

    max_retries: int = 5
    max_consecutive_failures: int = 50
    # This many requests sent in a row (send order, not arrival), all refused with one 4xx: the job's fault.
    max_identical_rejections: int = 16
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    drain_after: int = 3
    probe_interval_s: float = 1.0
    probe_interval_max_s: float = 15.0
    dead_timeout_s: float = 300.0
    restart_attempts: int = 3
    hung_after_s: float = 120.0  # requests in flight, no progress this long: hung (generate/health.py)
    # a busy engine's /health (or a drained one's probe request) may take a while; a hung one never answers
    health_timeout_s: float = 30.0


# which items a run sends: every item not done (normal), or the stored errors / truncated results again
RunMode = Literal["normal", "retry_errors", "redo_truncated"]


@dataclass(frozen=True)
class JobOptions:
    """A job's own settings, whatever serves it; the CLI builds them once from the job file and its flags."""

    input_path: Path
    out_dir: Path
    params: SamplingParams
    shape: RecordShape = field(default_factory=RecordShape)
    concurrency: int = 64
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    request_timeout_s: float = 3600.0
    mode: RunMode = "normal"
    force_params: bool = False
    add_input: bool = False  # `--add-input`: run another input into a folder that holds one on purpose
    # the model folder (local) whose chat template and tokenizer the servers apply: kept in the output
    # folder and recorded for the token export (`generate.modelfiles`); None: nothing is recorded
    model_dir: Path | None = None
    max_length: int | None = None  # the trainer's (the job file's): recorded, the training exports' default
    split: str | None = None
    wait_ready_s: float = 0.0  # no endpoint ready (at the start): wait this long for one, then FleetDown
    # `tune` on dummy weights (or given lengths): each request writes a length drawn from these (max_tokens
    # with ignore_eos), so the batch holds the job's mix of lengths; never for a run that keeps its text
    forced_lengths: OutputLengths | None = None
    under_way: int = 0  # with forced lengths: the first this many start as if under way (`generate.forced`)
    filler: Filler = field(default_factory=Filler)  # what stands for their written part, counted as it is
    progress_interval_s: float = 0.5
    series_interval_s: float = 5.0
    metrics_interval_s: float = 3.0
