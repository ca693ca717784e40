"""Quality flags for one generated answer: cheap, bounded-cost checks run once per completion.

- truncated: the engine stopped at max_tokens (`finish_reason == "length"`); a success, but flagged.
- empty: no answer text after the reasoning.
- leaked_think: `<think>`/`</think>` inside the answer: the reasoning parser did not split the trace.
- repetitive: the tail loops on an n-gram. Such samples teach a drafter to loop and inflate speculative
  acceptance, so they are flagged for `export --filter`.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from fleetgen.http.client import Completion

# Only the tail is examined: a degenerate loop runs until max_tokens, so it always reaches the end.
TAIL_WORDS = 400
TAIL_CHARS = 1600
MIN_WORDS = 80
WORD_NGRAM = 4
CHAR_NGRAM = 12
# Natural text has nearly all 4-grams distinct (> 0.9); a loop of period p has ~p distinct ones.
MAX_UNIQUE_FRACTION = 0.35
# The screen: a loop compresses several-fold; prose at zlib level 1 about 2x.
SCREEN_CHARS = 2048
MIN_SCREEN_BYTES = 400
SCREEN_RATIO = 3.0
# A 16 KiB window reaches every match of a probe of 2,048 characters (at most 8 KiB of UTF-8, so every
# distance under deflate's limit of the window less 262 bytes): the same output as zlib's default 32 KiB
# window, at about half the CPU (zlib sets up state per call that scales with the window; once per answer).
SCREEN_WBITS = 14


class Flags(NamedTuple):
    """The quality flags of a row (all turns of a conversation combined)."""

    is_truncated: bool = False
    is_empty: bool = False
    has_leaked_think: bool = False
    is_repetitive: bool = False


def has_think_marker(text: str) -> bool:
    """True when a reasoning marker leaked into `text` (case-insensitive, like SpecForge's check)."""
    lowered = text.lower()
    return "<think>" in lowered or "</think>" in lowered


def is_repetitive(text: str) -> bool:
    """True when the tail of `text` is a loop: few distinct n-grams among many.

    Two stages keep the cost flat: zlib (C speed) on the last 2,048 characters first — ordinary text barely
    compresses at level 1 — and only a suspicious tail gets the n-gram count: word 4-grams over the last 400
    words, or, for text without spaces (e.g. Chinese), character 12-grams over the last 1,600 characters.
    """
    probe = text[-SCREEN_CHARS:].encode()
    if len(probe) < MIN_SCREEN_BYTES or len(probe) < SCREEN_RATIO * compressed_size(probe):
        return False
    tail = text[-TAIL_CHARS * 4 :]
    words = tail.split()[-TAIL_WORDS:]
    if len(words) >= MIN_WORDS:
        grams = list(zip(*(words[i:] for i in range(WORD_NGRAM)), strict=False))
        return len(set(grams)) / len(grams) < MAX_UNIQUE_FRACTION
    chars = tail[-TAIL_CHARS:]
    if len(chars) < TAIL_CHARS // 2:
        return False
    num = len(chars) - CHAR_NGRAM + 1
    distinct = {chars[i : i + CHAR_NGRAM] for i in range(0, num)}
    return len(distinct) / num < MAX_UNIQUE_FRACTION


def compressed_size(probe: bytes) -> int:
    """The size of `probe` compressed by zlib at level 1 (the screen's measure of a loop)."""
    squeeze = zlib.compressobj(1, zlib.DEFLATED, SCREEN_WBITS)
    return len(squeeze.compress(probe)) + len(squeeze.flush())


def flags_of(completion: Completion) -> Flags:
    """The flags of one turn."""
    return Flags(
        is_truncated=completion.finish_reason == "length",
        is_empty=not completion.content.strip(),
        has_leaked_think=has_think_marker(completion.content),
        # Only the tails are joined: copying whole traces would cost per token.
        is_repetitive=is_repetitive(
            completion.reasoning_content[-TAIL_CHARS * 4 :] + "\n" + completion.content[-TAIL_CHARS * 4 :]
        ),
    )


def flags_of_all(completions: list[Completion]) -> Flags:
    """The flags of a conversation: a flag is set when any turn has it."""
    return Flags(*map(any, zip(*map(flags_of, completions), strict=True)))
