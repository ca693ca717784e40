"""Why an engine died, in its own words: THE place that reads it from the engine's log (pure).

Every reader of a dead engine asks here: `up`'s wait for a launch (`deploy/readywait.py`: a start that
failed), a fleet's instance whose process is gone (`fleet/status.py`: `status`, `run`'s endpoints, `bench`),
and a tune candidate that died under load (`tune/measure.py`). What it reads: the log's lines (its tail),
matched against the engine's fatal signatures (`Engine.fatal_signatures_for`, each with the release's fix) and
the generic ones here; the exception that caused the death (the last one raised, unless its own words put the
cause elsewhere); and the traceback's last frame above it (where the engine was: on the H100,
`chunk_delta_h.py:324 in chunk_gated_delta_rule_fwd_h`, the GDN chunked prefill, out of memory).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fleetgen.engines.base import Engine, FatalSignature

# Failures that are not the engine's own: the launch script or the interpreter could not start it.
GENERIC_SIGNATURES = (
    FatalSignature(
        r"exec: .*: (No such file or directory|not found)|: No such file or directory$",
        "the launch script could not execute the engine's python",
        "set engine.python to an interpreter that exists on the host (e.g. /opt/venv/bin/python)",
    ),
    FatalSignature(
        # only a raised exception: "No module named" inside a warning ("… not available (No module named
        # 'cuda.tile'), falling back …") or an "Ignore import error …" line is harmless
        r"^(?:\(\w+ pid=\d+\)\s+)?(?:ModuleNotFoundError|ImportError): No module named ['\"]?([\w.]+)",
        "the engine's python cannot import a module it needs",
        "install the missing module into engine.python's environment (or point engine.python / "
        "engine.launcher at one that has it)",
    ),
    FatalSignature(
        r"Permission denied",
        "the host refused to run something the launch needs",
        "check the permissions of engine.python and the workdir on the host",
    ),
    FatalSignature(
        r"Traceback \(most recent call last\)",
        "the engine raised an exception while starting",
        "read the log lines below; they end with the exception",
    ),
)
# The last line of a raised exception ("ModuleNotFoundError: No module named 'x'"), also behind vLLM's
# "(EngineCore pid=…) " process prefix; not a log line that merely mentions an error.
EXCEPTION_LINE = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s+)?((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?)$"
)
# An exception whose own words put the cause elsewhere (vLLM's API server after its engine core died).
POINTS_ELSEWHERE = re.compile(r"root cause above|see (?:the )?(?:error|log|traceback)s? above", re.IGNORECASE)
# A traceback's frame line: `  File "/x/y/chunk_delta_h.py", line 324, in chunk_gated_delta_rule_fwd_h`.
FRAME_LINE = re.compile(r'^\s*File "(?:[^"]*/)?([^"/]+)", line (\d+), in (\S+)')
WORDS_CHARS = 200  # the engine's words kept: whole sentences up to about this many characters


def first_fatal(
    lines: Sequence[str], signatures: Sequence[FatalSignature]
) -> tuple[FatalSignature, str] | None:
    """The first signature matching any of `lines` (engine signatures first: they are the most specific)."""
    for sig in signatures:
        for line in lines:
            if sig.search(line):
                return sig, line
    return None


def root_cause(lines: Sequence[str]) -> str | None:
    """The exception that caused a failure: the last one raised, unless its words say the cause is
    elsewhere ("Engine core initialization failed. See root cause above") — then the last before it that
    does not (vLLM: the `(EngineCore pid=…)` traceback's `ModuleNotFoundError: No module named 'flashinfer'`).
    """
    raised = [m.group(1) for line in lines if (m := EXCEPTION_LINE.match(line.strip()))]
    for exc in reversed(raised):
        if not POINTS_ELSEWHERE.search(exc):
            return exc
    return raised[-1] if raised else None


def last_frame(lines: Sequence[str], exception: str) -> str:
    """The traceback's last frame above the line that raised `exception` ("file.py:324 in func"), "" when no
    frame precedes it."""
    at = max((i for i, line in enumerate(lines) if line.strip().endswith(exception)), default=-1)
    for line in reversed(lines[: max(at, 0)]):
        if m := FRAME_LINE.match(line):
            return f"{m.group(1)}:{m.group(2)} in {m.group(3)}"
    return ""


def shortened(words: str) -> str:
    """The engine's words cut after the sentence that passes `WORDS_CHARS` (torch's OOM line runs on with
    advice about its allocator; what was asked and what was free comes first)."""
    if len(words) <= WORDS_CHARS:
        return words
    end = words.find(". ", WORDS_CHARS // 2)
    return words[: end + 1] if 0 <= end < 2 * WORDS_CHARS else words[:WORDS_CHARS] + "…"


@dataclass(frozen=True)
class Death:
    """Why an engine died: the known cause (a signature's, or "the engine raised X"), its last error in its
    own words, the traceback's last frame, and the fix."""

    cause: str
    words: str
    frame: str
    fix: str

    def text(self) -> str:
        """One line: cause, the engine's words, where."""
        said = f"{self.cause}: {self.words}" if self.words and self.words not in self.cause else self.cause
        return f"{said} (at {self.frame})" if self.frame else said


def death_of(lines: Sequence[str], signatures: Sequence[FatalSignature]) -> Death | None:
    """Why the engine whose log ends with `lines` died, by `signatures` (the engine's own first, then
    `GENERIC_SIGNATURES`); None when the log shows no error (killed from outside, or stopped cleanly)."""
    root = root_cause(lines)
    if root is not None:
        known = first_fatal([root], signatures)
        cause = known[0].cause if known else f"the engine raised {root.split(':')[0]}"
        fix = known[0].fix if known else "read the traceback that ends with it in the engine's log"
        return Death(cause, shortened(root), last_frame(lines, root), fix)
    found = first_fatal(lines, signatures)
    if found is None:
        return None
    return Death(found[0].cause, shortened(found[1].strip()), "", found[0].fix)


def signatures_of(engine: Engine, rule_set: str = "") -> tuple[FatalSignature, ...]:
    """The signatures an engine's log is read with: those of the rule set named `rule_set` (the one its launch
    recorded), else the release-independent ones, then `GENERIC_SIGNATURES`."""
    rules = next((r for r in engine.rule_sets if r.name == rule_set), None)
    own = engine.fatal_signatures_for(rules) if rules is not None else engine.fatal_signatures
    return (*own, *GENERIC_SIGNATURES)
