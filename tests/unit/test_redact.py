"""`fleetgen.redact`: every remembered secret out of any text, and out of whatever the CLI prints."""

from __future__ import annotations

import io

from hypothesis import assume, given
from hypothesis import strategies as st

from fleetgen import redact
from fleetgen.redact import REDACTED, RedactingStream, redacting, remember

KEY_CHARS = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="<>"))


@given(
    key=KEY_CHARS.filter(lambda k: len(k) >= 16),
    around=st.lists(st.text(max_size=30), min_size=1, max_size=6),
)
def test_a_remembered_key_never_survives_redaction(key: str, around: list[str]) -> None:
    """Whatever surrounds it (other text, the key twice in a row, a prefix of itself), never the key."""
    redact._known.clear()
    remember(key)
    remember("")  # nothing to redact: ignored, not "redact everything"
    text = key.join(around) + key + key[:-1]
    assume(REDACTED not in text)
    out = redact.redact(text)
    assert key not in out and out.count(REDACTED) >= text.count(key)
    assert out.replace(REDACTED, key) == text  # the key's places only: every other character as it was
    redact._known.clear()
    assert redact.redact(text) == text


@given(text=st.text(), keys=st.lists(KEY_CHARS, max_size=3))
def test_a_line_without_a_secret_is_printed_as_it_is(text: str, keys: list[str]) -> None:
    """Remembered keys (an empty one too: a fleet file's `api_key = ""`) change no line that holds none."""
    assume(not any(key and key in text for key in keys))
    redact._known.clear()
    for key in keys:
        remember(key)
    assert redact.redact(text) == text
    redact._known.clear()


def test_the_longer_of_two_overlapping_secrets_goes_whole() -> None:
    redact._known.clear()
    remember("sk-aaaaaaaaaaaaaaaa")
    remember("sk-aaaaaaaaaaaaaaaa-and-more")
    assert redact.redact("x sk-aaaaaaaaaaaaaaaa-and-more y") == f"x {REDACTED} y"
    redact._known.clear()


def test_the_stream_wrapper_redacts_writes_and_is_otherwise_the_stream() -> None:
    redact._known.clear()
    inner = io.StringIO()
    stream = redacting(inner)
    assert redacting(stream) is stream  # wrapped once
    remember("sk-0123456789abcdef")  # remembered after wrapping: still redacted
    print("key=sk-0123456789abcdef", file=stream)
    stream.writelines(["a sk-0123456789abcdef\n"])
    assert inner.getvalue() == f"key={REDACTED}\na {REDACTED}\n"
    assert isinstance(stream, RedactingStream)  # any other attribute is the inner stream's:
    assert stream.isatty() is False and stream.getvalue() == inner.getvalue()
    redact._known.clear()
