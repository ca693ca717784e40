"""Known secrets out of every text fleetgen prints: one registry, one function, one stream wrapper.

The CLI registers each secret a command may meet with `remember` before anything runs (the API key:
`cli.app.read_fleet`, the command's one read of its fleet file), and wraps its stdout and stderr in
`RedactingStream` once per command (`cli.app`), so every line fleetgen prints — a
log tail, `up`'s error tail, a watch failure, a status row, an error's context — reaches the terminal with
each known secret replaced by `REDACTED`. The hosts' logs are already redacted as they are written (the
launch script pipes the engine's output through `deploy.script.REDACTOR`); this is the second layer, for
old logs and for anything else a host says back.
"""

from __future__ import annotations

from typing import Any, TextIO, cast

REDACTED = "<redacted>"

_known: set[str] = set()


def remember(secret: str) -> None:
    """Redact `secret` from everything printed from now on (in this process)."""
    if secret:
        _known.add(secret)


def redact(text: str) -> str:
    """`text` with every remembered secret replaced by REDACTED (longest first: one may contain another)."""
    for secret in sorted(_known, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


class RedactingStream:
    """A text stream that redacts what is written to it, and is otherwise the stream it wraps."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def redacting(stream: TextIO) -> TextIO:
    """`stream` wrapped once (wrapping a wrapped stream returns it as it is)."""
    if isinstance(stream, RedactingStream):
        return stream
    return cast(TextIO, RedactingStream(stream))  # duck-typed: every other attribute is the inner stream's
