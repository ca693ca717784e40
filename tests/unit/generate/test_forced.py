"""Forced output lengths and the steady start (`generate.forced`): what each request is asked to write, and
the first batch sent as requests already under way."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from fleetgen.errors import ConfigError
from fleetgen.generate.forced import Filler, ForcedLengths, filler_for, forced_length, under_way
from fleetgen.plan.job import EmpiricalLengths, LogNormalLengths, OutputLengths

KEYS = [random.Random(i).getrandbits(63) for i in range(2000)]
FILLER = Filler().unit


def body(text: Any = "hello") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": text}]}


def written_of(sent: dict[str, Any], original: dict[str, Any]) -> int:
    """The filler tokens a sent body carries beyond the original's."""
    text = "".join(m["content"] for m in sent["messages"] if isinstance(m["content"], str))
    base = "".join(m["content"] for m in original["messages"] if isinstance(m["content"], str))
    extra = text[len(base) :] if text.startswith(base) else text
    assert extra == FILLER * (len(extra) // len(FILLER))
    return len(extra) // len(FILLER)


def test_forced_lengths_are_the_distributions_and_the_same_for_a_request_everywhere() -> None:
    spec = LogNormalLengths.parse("mean=300,min=50,max=1000")
    bodies = [forced_length(spec, k) for k in KEYS]
    assert all(b["ignore_eos"] is True and 50 <= b["max_tokens"] <= 1000 for b in bodies)
    assert [forced_length(spec, k) for k in KEYS] == bodies
    assert abs(sum(b["max_tokens"] for b in bodies) / len(bodies) - 300) < 30


def test_a_request_under_way_is_length_biased_and_part_written() -> None:
    """Caught mid-flight, a request's whole length is drawn in proportion to it: the mean is E[L²]/E[L],
    above the distribution's own; what it has written is uniform over it, so about half is left."""
    spec = LogNormalLengths.parse("mean=1800,min=300,max=6000")
    draws = [under_way(spec, k) for k in KEYS]
    assert all(300 <= whole <= 6000 and 0 <= done < whole for whole, done in draws)
    plain = sum(forced_length(spec, k)["max_tokens"] for k in KEYS) / len(KEYS)
    biased = sum(w for w, _ in draws) / len(draws)
    assert biased > 1.2 * plain
    left = sum(w - d for w, d in draws) / sum(w for w, _ in draws)
    assert 0.4 < left < 0.6
    assert [under_way(spec, k) for k in KEYS[:50]] == draws[:50]  # seeded by the work key


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.builds(
            lambda lo, span, frac: LogNormalLengths.parse(
                f"mean={lo + span * frac:.1f},min={lo},max={lo + span}"
            ),
            st.integers(1, 500),
            st.integers(100, 5000),
            st.floats(0.3, 0.7),
        ),
        st.lists(st.integers(1, 4000), min_size=1, max_size=30).map(
            lambda v: EmpiricalLengths(tuple(v), "test")
        ),
    ),
    st.integers(0, 40),
    st.lists(st.integers(0, 2**62), min_size=1, max_size=80, unique=True),
)
def test_the_first_batch_starts_under_way_and_every_request_writes_a_length_of_the_job(
    lengths: OutputLengths, size: int, keys: list[int]
) -> None:
    """Whatever the lengths and the batch: the first `size` distinct requests carry filler (what they wrote)
    and ask the rest, whole lengths within the distribution's range; the others are plain forced lengths;
    a request sent again (a retry) is sent the same body."""
    forced = ForcedLengths(lengths, size)
    original = body()
    sent = [forced.apply(original, k) for k in keys]
    hi = lengths.stats.max
    for i, (k, b) in enumerate(zip(keys, sent, strict=True)):
        done = written_of(b, original)
        assert b["ignore_eos"] is True and b["max_tokens"] >= 1
        if i < size:
            assert (b["max_tokens"] + done, done) == under_way(lengths, k)
        else:
            assert done == 0 and b == original | forced_length(lengths, k)
        assert b["max_tokens"] + done <= hi
    assert [forced.apply(original, k) for k in keys] == sent
    assert original == body()  # the caller's body is not touched


def test_filler_goes_after_the_text_or_in_a_message_of_its_own() -> None:
    spec = EmpiricalLengths((1000,), "test")
    key = next(k for k in KEYS if under_way(spec, k)[1] > 0)
    done = under_way(spec, key)[1]
    text = ForcedLengths(spec, 1).apply(body("hi"), key)
    assert text["messages"][-1]["content"] == "hi" + FILLER * done and len(text["messages"]) == 2
    parts = [{"type": "text", "text": "hi"}]
    other = ForcedLengths(spec, 1).apply(body(parts), key)
    assert other["messages"][1]["content"] == parts
    assert other["messages"][2] == {"role": "user", "content": FILLER * done}


# --- the filler, counted with the model's tokenizer ------------------------------------------------------

CORPUS = Path(__file__).parents[2] / "data" / "corpus"


@functools.cache
def corpus_bpe(vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on the repo's corpus, as the H200 bundle's and the tiny model's tokenizers
    are (`scripts/airgap_prepare.py`, `scripts/build_tiny_model.py`): a real tokenizer in which " x" is two
    tokens, the case that doubled every written part on the H200."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train(sorted(str(p) for p in CORPUS.glob("*.txt")), trainer)
    return tokenizer


def count_with(tokenizer: Tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


CORPUS_LINES = [line for p in sorted(CORPUS.glob("*.txt")) for line in p.read_text().splitlines() if line]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([300, 2048]), st.sampled_from(CORPUS_LINES), st.integers(0, 3000))
def test_the_filler_adds_exactly_the_tokens_it_says_after_any_prompt(
    vocab_size: int, prompt: str, written: int
) -> None:
    """Whatever the tokenizer (a large vocabulary or one with few merges) and the prompt before it: the
    filler for `written` tokens adds exactly the tokens it claims to the prompt, and at most `written`
    (the request then asks `whole - tokens`: its context is the job's, never more)."""
    count = count_with(corpus_bpe(vocab_size))
    filler = filler_for(count, "corpus BPE")
    text, tokens = filler.text_for(written)
    assert not filler.is_assumed
    assert count(prompt + text) - count(prompt) == tokens
    assert written - filler.unit_tokens < tokens <= written


def test_the_filler_is_not_the_unit_the_tokenizer_splits() -> None:
    """The H200's case: " x" is two tokens in the bundle's tokenizer; a one-token unit is chosen."""
    count = count_with(corpus_bpe(2048))
    assert count(" x" * 10) == 20
    filler = filler_for(count, "corpus BPE")
    assert filler.unit_tokens == 1 and count(filler.unit * 100) == 100


def test_a_unit_whose_count_depends_on_its_neighbours_is_never_chosen() -> None:
    """Units that merge when repeated, or with the text before them, are skipped for one that counts the
    same every time; with none left, the steady start is refused (it could not say what the batch holds)."""

    def merging(text: str) -> int:
        """A character a token, but " the the" is one token: a repeated unit merges pairwise."""
        return len(text) - 7 * text.count(" the the")

    filler = filler_for(merging, "merging")
    assert (filler.unit, filler.unit_tokens) == (".", 1)  # " the" merges; the others count a character each

    def boundary(text: str) -> int:
        """ " the" is one token, but merges with a sentence's end before it (". the" is one token)."""
        return len(text.replace(". the", "#").replace(" the", "T"))

    assert boundary(" the" * 64) == 64 and filler_for(boundary, "boundary").unit == "."
    with pytest.raises(ConfigError) as caught:
        filler_for(lambda text: len(text) // 3, "no exact unit")
    assert "--no-steady-start" in caught.value.fix


def test_steady_bodies_carry_the_fillers_text_and_ask_the_rest() -> None:
    """A filler of two tokens a unit: the written part is whole units, and max_tokens + what the filler
    holds is the request's whole length."""
    spec = LogNormalLengths.parse("mean=1800,min=300,max=6000")
    two = Filler(" x", 2, "two tokens a unit", is_assumed=False)
    forced = ForcedLengths(spec, 50, two)
    for key in KEYS[:50]:
        sent = forced.apply(body(), key)
        extra = sent["messages"][-1]["content"][len("hello") :]
        units = extra.count(" x")
        whole, written = under_way(spec, key)
        assert extra == " x" * units and units == written // 2
        assert sent["max_tokens"] + 2 * units == whole
