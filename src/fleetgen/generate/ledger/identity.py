"""What ties an output folder to its input: the input's identity, checked before any work is sent.

A job is "the same job" when its input is the same data read the same way and every field that changes a
row is the same: the input's identity (here), the record shape (`id_field`, `prompt_field`), and the sampling
params with the served model (`SamplingParams`, checked by the runner). The identity is stored in the store's
meta (`input_identity`) by the first run and compared by every later one:

- a file: its size and a digest of sampled byte ranges of it (the first 64 KiB, 16 blocks of 4 KiB spread
  over the file, the last 64 KiB: about 20 reads, whatever the size). The path is not part of it (a moved
  file is the same input);
- JSONL (plain or compressed) may grow: a file whose first `size` bytes sample as stored is the same input
  with records appended, and resumes as such;
- Parquet and a `datasets` folder (each of its Arrow files, and the split) must be unchanged.
The resume position carries its own check (`ResumeCheck`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO, Any

import orjson

from fleetgen.errors import InputMismatch
from fleetgen.generate.source import compression_of, input_files
from fleetgen.generate.work import JobOptions, RecordShape, changes

HEAD = TAIL = 64 * 1024
BLOCK = 4096
NUM_BLOCKS = 16
VERSION = 1


def sample_digest(path: Path, size: int) -> str:
    """A digest of sampled ranges of the first `size` bytes of `path` (deterministic given `size`)."""
    ranges = [(0, min(HEAD, size))]
    ranges += [(size * i // (NUM_BLOCKS + 1), BLOCK) for i in range(1, NUM_BLOCKS + 1)]
    ranges.append((max(size - TAIL, 0), min(TAIL, size)))
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    with path.open("rb") as handle:
        for start, length in ranges:
            handle.seek(start)
            digest.update(handle.read(max(min(length, size - start), 0)))
    return digest.hexdigest()


def identify(path: Path, split: str | None, shape: RecordShape) -> dict[str, Any]:
    """The identity of an input as it is now."""
    kind = "datasets" if path.is_dir() else "parquet" if path.suffix == ".parquet" else "jsonl"
    parts = []
    for file in input_files(path, split):
        size = file.stat().st_size
        name = str(file.relative_to(path)) if path.is_dir() else file.name
        parts.append({"name": name, "size": size, "sample": sample_digest(file, size)})
    return {
        "version": VERSION,
        "kind": kind,
        "compression": compression_of(path) if kind == "jsonl" else None,
        "path": str(path.resolve()),
        "split": split if kind == "datasets" else None,
        "shape": {"id_field": shape.id_field, "prompt_field": shape.prompt_field},
        "parts": parts,
    }


def differences(stored: dict[str, Any], path: Path, now: dict[str, Any]) -> list[str]:
    """Why the input `now` is not the input `stored` (empty: the same input, maybe with records appended)."""
    diffs = changes(stored, now, ("kind", "split", "shape"))
    if diffs:
        return diffs
    old, new = stored.get("parts", []), now["parts"]
    if now["kind"] == "jsonl" and len(old) == 1 and len(new) == 1:
        size = int(old[0]["size"])
        if new[0]["size"] < size:
            return [
                f"the file is smaller than the one this folder was made from ({new[0]['size']} < {size} B)"
            ]
        if sample_digest(path, size) != old[0]["sample"]:
            return [f"the file's first {size} bytes differ from the file this folder was made from"]
        return []
    if old != new:  # each part: name, size, sample
        names = ", ".join(f"{p['name']} ({p['size']} B)" for p in old[:4])
        return [
            f"the files differ from the ones this folder was made from ({names}"
            f"{', …' if len(old) > 4 else ''})"
        ]
    return []


def check(stored_json: str | None, opts: JobOptions) -> dict[str, Any]:
    """The input's identity now, after checking it is the folder's input; raise InputMismatch if not.

    `--add-input` (`opts.add_input`): run another input into the folder on purpose (the caller keeps the
    earlier identity and re-reads the new input from its start, skipping records whose id and content are
    stored).
    """
    path, out_dir = opts.input_path, opts.out_dir
    now = identify(path, opts.split, opts.shape)
    if stored_json is None or opts.add_input:
        return now
    stored = orjson.loads(stored_json)
    diffs = differences(stored, path, now)
    if diffs:
        raise InputMismatch(
            f"{out_dir} holds the results of another input than {path}; running it here would mix two "
            "datasets (old answers kept for records that share an id, records skipped as done)",
            context={"made from": stored.get("path"), "differences": "\n".join(diffs)},
            fix=f"write this input to another folder (-o), or pass --add-input to add it to {out_dir} on "
            "purpose (records whose id is stored with other content are then refused)",
        )
    return now


class ResumeCheck:
    """The check stored with a resume position, kept current as the position moves.

    A saved position is trusted when every input file's (size, mtime) is as it was when it was written (the
    bytes before it are the ones that were read). Else, for plain JSONL, when the bytes before it still hash
    as they did (a file with records appended resumes by a seek after one sequential read of the done
    prefix); else (compressed, Parquet, datasets) it is not trusted and the rerun re-reads the input,
    skipping records whose id and content are stored.
    The prefix digests are a chain of (end offset, digest) segments, one per run: each run hashes only the
    bytes its position moved over.
    """

    def __init__(self, path: Path, input_identity: dict[str, Any], split: str | None) -> None:
        self._path = path
        self._files = input_files(path, split)
        # Plain JSONL: a resume seeks to a byte offset, checked by the digests of the bytes before it.
        self._seekable = input_identity["kind"] == "jsonl" and input_identity["compression"] is None
        self._chain: list[list[Any]] = []
        self._hash = hashlib.blake2b(digest_size=16)
        self._start = self._offset = 0

    def stat(self) -> list[list[int]]:
        return [[(st := file.stat()).st_size, st.st_mtime_ns] for file in self._files]

    def trusts(self, saved: dict[str, Any]) -> bool:
        """Whether a saved position may be used; if so, later positions extend its chain."""
        offset = int(saved.get("offset", 0))
        chain = saved.get("chain") or []
        if saved.get("stat") != self.stat() and not (self._seekable and self._chain_holds(chain, offset)):
            return False
        self._chain = [list(segment) for segment in chain]
        self._start = self._offset = offset
        return True

    def value(self, line: int, offset: int) -> dict[str, Any]:
        """The position to save, with its check."""
        chain = self._chain
        if self._seekable and offset > self._start:
            with self._path.open("rb") as handle:
                handle.seek(self._offset)
                self._offset += _hash_next(handle, offset - self._offset, self._hash)
            chain = [*self._chain, [offset, self._hash.hexdigest()]]
        return {"line": line, "offset": offset, "stat": self.stat(), "chain": chain}

    def _chain_holds(self, chain: list[list[Any]], offset: int) -> bool:
        if offset == 0:
            return True
        if not chain or chain[-1][0] != offset:
            return False
        start = 0
        with self._path.open("rb") as handle:
            for end, digest in chain:
                segment, length = hashlib.blake2b(digest_size=16), int(end) - start
                if _hash_next(handle, length, segment) != length or segment.hexdigest() != digest:
                    return False
                start = int(end)
        return True


def _hash_next(handle: IO[bytes], length: int, digest: Any) -> int:
    """Hash the next `length` bytes of `handle` into `digest`; how many there were (fewer at the end)."""
    done = 0
    while done < length and (block := handle.read(min(length - done, 1 << 20))):
        digest.update(block)
        done += len(block)
    return done
