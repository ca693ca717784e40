"""The stored token ids (`generate/ledger/tokenids.py`): `unpack(pack(x)) == x` for any ids a tokenizer can
give, far smaller than the JSON they replace, and a blob that is not ours is an error, never wrong ids."""

from __future__ import annotations

import struct

import orjson
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.errors import JobError
from fleetgen.generate.ledger import tokenids
from fleetgen.generate.ledger.tokenids import TokenIds

ID = st.integers(min_value=0, max_value=2**32 - 1)


@given(st.lists(ID, max_size=300), st.lists(ID, max_size=300))
def test_the_ids_come_back_exactly_with_the_prompt_and_answer_apart(
    prompt: list[int], output: list[int]
) -> None:
    assert tokenids.unpack(tokenids.pack(TokenIds(prompt, output))) == TokenIds(prompt, output)


def test_an_id_no_uint32_holds_is_refused_not_stored_wrong() -> None:
    with pytest.raises(OverflowError):
        tokenids.pack(TokenIds([1], [2**32]))
    with pytest.raises(OverflowError):
        tokenids.pack(TokenIds([-1], []))


def test_a_long_answer_costs_well_under_its_json() -> None:
    """A thinking trace's ids (a vocabulary of 150k, words that recur) against the JSON stored before."""
    words = [(i * 7919) % 151_000 for i in range(400)]
    output = [words[(i * i) % len(words)] for i in range(6_000)]
    prompt = list(range(200, 400))
    packed = tokenids.pack(TokenIds(prompt, output))
    as_json = orjson.dumps({"prompt": prompt, "output": output})
    assert len(packed) < 4 * (len(prompt) + len(output)) < len(as_json)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not zstd at all",
        tokenids.pack(TokenIds([1, 2], [3]))[:-3],  # torn
    ],
)
def test_a_blob_that_is_not_a_whole_frame_of_ours_is_an_error(blob: bytes) -> None:
    with pytest.raises(JobError) as err:
        tokenids.unpack(blob)
    assert err.value.fix


def test_another_version_or_a_bad_length_is_an_error() -> None:
    def frame(version: int, n_prompt: int, ids: list[int]) -> bytes:
        raw = struct.pack("<BI", version, n_prompt) + struct.pack(f"<{len(ids)}I", *ids)
        return zstandard.ZstdCompressor().compress(raw)

    assert tokenids.unpack(frame(1, 1, [5, 6])) == TokenIds([5], [6])
    for bad in (frame(2, 1, [5, 6]), frame(1, 3, [5, 6])):
        with pytest.raises(JobError):
            tokenids.unpack(bad)
