"""One way to write a file fleetgen owns (`.fleetgen/state.json`, a report): whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temp file beside it (0600, same filesystem), fsynced, then renamed
    over `path`: a reader, or a crash, sees the old file or the new one, never half of one. An OSError is the
    caller's (the CLI says it with the path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone after the rename; left over only by a failed write
