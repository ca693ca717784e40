"""Simulated generations: deterministic token streams, reasoning/answer split, and test directives.

No tokenizer: a "token" is one short word (with its leading space), so token counts are exact by
construction. A generation is `reasoning tokens + "</think>" + answer tokens` when thinking is on, else
answer tokens only; `max_tokens` cuts that sequence (finish_reason "length"). Texts are cached per
(variant, counts, mode) because the simulator must answer thousands of requests a second.

Directives let driver tests inject faults deterministically: a user message containing
`[[sim:status=429:times=2]]` gets HTTP 429 the first 2 times that exact message is seen (status 400, 429, 500,
503); `[[sim:finish=length]]` reports truncation; `[[sim:tokens=N]]` sets the output length;
`[[sim:delay=S]]` adds S seconds before answering.

With `--sim-answer-digest` every answer begins with `sim-digest:HEX ` (`prompt_digest` of the request's
system and user texts): a test proves from the answer alone which prompt it answers (the tag is no token).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
import re
from typing import Literal

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by at this are from or an which one all have "
    "were there can more if will up out so some about into than them these two may then first other way "
    "many time has look would like long make thing see him could people number only new water word work "
    "part over take place made live where after back little most very after give our name good sentence "
    "man think say great help through much before line right too means old any same tell boy follow came "
    "want show also around form three small set put end does another well large must big even such because "
    "turn here why ask went men read need land different home move try kind hand picture again change off "
    "play spell air away animal house point page letter mother answer found study still learn should world"
)
WORDS = tuple(_WORD_TEXT.split())
THINK_END = "</think>"
DIRECTIVE = re.compile(r"\[\[sim:([^\]]*)\]\]")
ERROR_STATUSES = frozenset({400, 429, 500, 503})
NUM_UNSEEDED_VARIANTS = 8  # without a seed, answers vary like sampling does, among a few cached texts


@dataclasses.dataclass(frozen=True)
class Directives:
    """Fault-injection and shaping directives found in a request's user messages."""

    status: int | None = None
    times: int = 1
    finish: str | None = None
    tokens: int | None = None
    delay: float = 0.0


def parse_directives(text: str) -> Directives:
    """`[[sim:key=value:key=value]]` tags in `text` (several tags merge; unknown keys are ignored)."""
    values: dict[str, str] = {}
    for tag in DIRECTIVE.findall(text):
        for part in tag.split(":"):
            key, _, value = part.partition("=")
            values[key.strip()] = value.strip()
    status = int(values["status"]) if "status" in values else None
    if status is not None and status not in ERROR_STATUSES:
        status = None
    return Directives(
        status=status,
        times=int(values.get("times", "1")),
        finish=values.get("finish"),
        tokens=int(values["tokens"]) if "tokens" in values else None,
        delay=float(values.get("delay", "0")),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Generation:
    """One choice's output, already split the way the serving layer reports it.

    Hashed by identity (`eq=False`): `generate` caches it, and the serving layer caches JSON fragments per
    object, so hashing must not walk 1,800 strings per request.
    """

    reasoning: str | None  # reasoning_content, or None
    content: str
    completion_tokens: int
    reasoning_tokens: int
    finish_reason: Literal["stop", "length"]
    reasoning_pieces: tuple[str, ...]  # stream deltas (stream_interval tokens each)
    content_pieces: tuple[str, ...]


@functools.lru_cache(maxsize=64)
def _tokens(variant: int, count: int) -> tuple[str, ...]:
    rng = random.Random(variant)
    return tuple(" " + rng.choice(WORDS) for _ in range(count))


def _pieces(tokens: tuple[str, ...], interval: int) -> tuple[str, ...]:
    """Stream deltas of `interval` tokens; they concatenate to the non-stream text (leading space dropped)."""
    step = max(1, interval)
    pieces = ["".join(tokens[i : i + step]) for i in range(0, len(tokens), step)]
    if pieces:
        pieces[0] = pieces[0].lstrip()
    return tuple(piece for piece in pieces if piece)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What decides a generation's text: cache key of `generate`."""

    variant: int
    total_tokens: int
    max_tokens: int | None
    thinking: bool
    separate: bool  # a reasoning parser is set and the request asks for separate reasoning
    reasoning_fraction: float
    force_length: bool
    stream_interval: int


@functools.lru_cache(maxsize=512)
def generate(shape: Shape) -> Generation:
    """The text for one choice (cached: same shape → same object)."""
    total = max(1, shape.total_tokens)
    num_reasoning = max(1, round(total * shape.reasoning_fraction)) if shape.thinking else 0
    num_reasoning = min(num_reasoning, total)
    limit = total if shape.max_tokens is None else min(total, max(1, shape.max_tokens))
    finish: Literal["stop", "length"] = "length" if limit < total or shape.force_length else "stop"
    # Reasoning words, then </think> (one token), then the answer: the sequence max_tokens cuts.
    words = _tokens(shape.variant, total)
    reasoning_words = words[: max(0, num_reasoning - 1)]
    answer_words = words[num_reasoning:total]
    kept_reasoning = reasoning_words[:limit]
    closed = not shape.thinking or limit >= num_reasoning
    kept_answer = answer_words[: max(0, limit - num_reasoning)] if closed else ()
    interval = shape.stream_interval
    if not shape.thinking:
        pieces = _pieces(kept_answer, interval)
        return Generation(None, "".join(pieces), limit, 0, finish, (), pieces)
    reasoning_tokens = min(limit, num_reasoning)
    if not shape.separate:
        # No parser (or separate_reasoning=false): the raw text, </think> included, is the content.
        raw = kept_reasoning + (("\n" + THINK_END + "\n\n", *kept_answer) if closed else ())
        pieces = _pieces(raw, interval)
        return Generation(None, "".join(pieces), limit, reasoning_tokens, finish, (), pieces)
    reasoning_pieces = _pieces(kept_reasoning, interval)
    content_pieces = _pieces(kept_answer, interval)
    return Generation(
        reasoning="".join(reasoning_pieces) or None,
        content="".join(content_pieces),
        completion_tokens=limit,
        reasoning_tokens=reasoning_tokens,
        finish_reason=finish,
        reasoning_pieces=reasoning_pieces,
        content_pieces=content_pieces,
    )


def estimate_prompt_tokens(texts: list[str]) -> int:
    """Prompt tokens without a tokenizer: ~4 characters a token plus a chat-template overhead per message."""
    return sum(len(text) // 4 + 5 for text in texts) + 3


def pick_variant(seed: int | None, index: int) -> int:
    """A seed makes the text deterministic (per choice index); no seed picks one of a few cached variants."""
    if seed is not None:
        return seed * 1000 + index
    return random.randrange(NUM_UNSEEDED_VARIANTS) + 10**9


DIGEST_TAG = "sim-digest:"


def prompt_digest(texts: list[str]) -> str:
    """A short digest of a request's system and user texts, in order (what `--sim-answer-digest` writes)."""
    hasher = hashlib.blake2b(digest_size=8)
    for text in texts:
        hasher.update(text.encode() + b"\x00")
    return hasher.hexdigest()


def with_digest(gen: Generation, texts: list[str]) -> Generation:
    """`gen` whose answer begins with `sim-digest:HEX ` for the prompt `texts` (a new, uncached object)."""
    tag = f"{DIGEST_TAG}{prompt_digest(texts)} "
    pieces = (tag + gen.content_pieces[0], *gen.content_pieces[1:]) if gen.content_pieces else (tag.strip(),)
    return dataclasses.replace(gen, content="".join(pieces), content_pieces=pieces)
