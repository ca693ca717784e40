"""The last turn's token ids as the store keeps them: one zstd frame of little-endian uint32s.

A 1.6 B-token job keeps every generated id: as JSON text they cost ~6 bytes a token (more than the answer's
own text); packed they cost 4 before compression and ~1.5–2.5 after (ids of one answer repeat). The frame
holds the prompt's length, then the prompt's ids, then the answer's; a version byte in front keeps the format
open. `pack` and `unpack` are each other's inverse for any ids in [0, 2³²) — the only place that knows the
layout (`rows.py` writes through it, `export_tokens.py` reads through it).
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import NamedTuple

import zstandard

from fleetgen.errors import JobError

VERSION = 1
_HEADER = struct.Struct("<BI")  # version, the prompt's length in ids
_FIX = "export with the fleetgen release that ran the job, or without the stored ids (--format sharegpt)"
_LEVEL = 3  # zstd's default: ~1 ms for a 2,000-id row, a third of JSON's size


class TokenIds(NamedTuple):
    """The last turn as the engine tokenized it: its prompt's ids and the ids it generated."""

    prompt: list[int]
    output: list[int]


def pack(ids: TokenIds) -> bytes:
    """The ids as stored (a BLOB): version, prompt length, then every id as a little-endian uint32, zstd."""
    values = array("I", ids.prompt)  # OverflowError for an id outside [0, 2³²): never stored wrong
    values.extend(ids.output)
    if sys.byteorder != "little":
        values.byteswap()
    raw = _HEADER.pack(VERSION, len(ids.prompt)) + values.tobytes()
    return zstandard.ZstdCompressor(level=_LEVEL).compress(raw)


def unpack(blob: bytes) -> TokenIds:
    """What `pack` stored; a blob of another version or a torn one is a `JobError`, never wrong ids."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(blob)
        version, n_prompt = _HEADER.unpack_from(raw)
    except (zstandard.ZstdError, struct.error) as err:
        raise JobError(f"a stored row's token ids cannot be read: {err}", fix=_FIX) from err
    body = raw[_HEADER.size :]
    if version != VERSION or len(body) % 4 or n_prompt > len(body) // 4:
        raise JobError(
            f"a stored row's token ids are not of this fleetgen's format (version {version})", fix=_FIX
        )
    values = array("I")
    values.frombytes(body)
    if sys.byteorder != "little":
        values.byteswap()
    ids = values.tolist()
    return TokenIds(ids[:n_prompt], ids[n_prompt:])
