"""Forced output lengths and the steady start (`generate.forced`): what each request is asked to write, and
the first batch sent as requests already under way."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.generate.forced import FILLER, ForcedLengths, forced_length, under_way
from fleetgen.plan.job import EmpiricalLengths, LogNormalLengths, OutputLengths

KEYS = [random.Random(i).getrandbits(63) for i in range(2000)]


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
