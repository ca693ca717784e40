"""The chaos test's verdict: the store (`out/results.sqlite`) against the oracle's ledger (`hostile.oracle`).

Rows expected / found / duplicated / lost / overwritten, as a table; every problem named with its id and line.
"Overwritten": a row whose line or prompt is not its owner's, or whose answer does not carry the digest of the
prompt stored with it (`--sim-answer-digest`: the answer was written for another prompt).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetgen.sim.text import DIGEST_TAG, prompt_digest
from tests.integration.chaos.hostile import Expected, flat_texts


@dataclass
class Verdict:
    """What the store holds against what the input implies; `problems` by kind (empty: all held)."""

    counts: dict[str, int] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)
    store: dict[str, int] = field(default_factory=dict)  # rows per table, for the summary's comparison

    def add(self, kind: str, what: str) -> None:
        self.problems.setdefault(kind, []).append(what)

    def table(self) -> str:
        rows = [f"  {name:<28} {value:>6}" for name, value in self.counts.items()]
        return "\n".join(["  ledger (rows)                  count", *rows])

    def report(self, limit: int = 8) -> str:
        """Each kind of problem: how many, and the first `limit` of them."""
        parts = []
        for kind, items in self.problems.items():
            shown = "\n      ".join(items[:limit])
            parts.append(f"  {kind}: {len(items)}\n      {shown}")
        return "\n".join(parts)


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return list(conn.execute(sql))


def judge(out: Path, expected: Expected) -> Verdict:
    """Read the store once and compare every table with the oracle."""
    db = out / "results.sqlite"
    results = _rows(db, "SELECT id, sample, line, prompt, content FROM results")
    errors = _rows(db, "SELECT id, sample, line, kind, reason FROM errors")
    bad = _rows(db, "SELECT line, reason FROM inputs_bad")
    verdict = Verdict()
    verdict.store = {"results": len(results), "errors": len(errors), "bad_inputs": len(bad)}
    verdict.store["truncated"] = _rows(db, "SELECT COUNT(*) FROM results WHERE is_truncated = 1")[0][0]
    _judge_keys(verdict, expected, results, errors)
    _judge_answers(verdict, expected, results)
    _judge_bad(verdict, expected, bad)
    return verdict


def _judge_keys(
    verdict: Verdict, expected: Expected, results: list[tuple[Any, ...]], errors: list[tuple[Any, ...]]
) -> None:
    """Every owned id exactly once (sample 0), as a result or (its prompt past the context) an error row."""
    keys = [(rid, sample) for rid, sample, *_ in results] + [(rid, sample) for rid, sample, *_ in errors]
    found = {key for key in keys if key[0] in expected.owners and key[1] == 0}
    duplicated = {key for key, num in Counter(keys).items() if num > 1}
    for rid, sample in sorted(set(keys) - found):
        verdict.add("unexpected rows (no owner)", f"id {rid!r} sample {sample}")
    lost = sorted(set(expected.owners) - {rid for rid, _ in found})
    for rid in lost:
        verdict.add("lost", f"id {rid!r} (line {expected.owners[rid]})")
    for key in sorted(duplicated):
        verdict.add("duplicated", f"id {key[0]!r} sample {key[1]}")
    error_rows = {rid: (line, kind, reason) for rid, _, line, kind, reason in errors}
    for rid, (line, kind, reason) in error_rows.items():
        if rid not in expected.too_long:
            verdict.add("errors that should be results", f"id {rid!r} line {line}: {kind}: {reason[:120]}")
        elif kind != "prompt_too_long" or line != expected.too_long[rid]:
            verdict.add("prompt_too_long wrong", f"id {rid!r}: line {line} kind {kind}")
    for rid in expected.too_long.keys() - error_rows.keys():
        verdict.add("prompt_too_long not an errors row", f"id {rid!r} (line {expected.too_long[rid]})")
    verdict.counts.update(
        expected=len(expected.owners),
        found=len(found),
        duplicated=len(duplicated),
        lost=len(lost),
        **{"errors (prompt_too_long)": sum(1 for v in error_rows.values() if v[1] == "prompt_too_long")},
    )


def _judge_answers(verdict: Verdict, expected: Expected, results: list[tuple[Any, ...]]) -> None:
    """A result is its owner's: the owner's line and prompt, an answer carrying that prompt's digest."""
    overwritten = 0
    for rid, _, line, prompt, content in results:
        if rid not in expected.owners:
            continue
        stored = json.loads(prompt)
        owner = expected.segments[rid]
        tag = DIGEST_TAG + prompt_digest(flat_texts(stored))
        wrong = []
        if line != expected.owners[rid]:
            wrong.append(f"line {line}, owner at line {expected.owners[rid]}")
        if stored != owner:
            wrong.append("stored prompt is not the owner's")
        if not content.startswith(tag):
            wrong.append(f"answer {content[:40]!r} is not for its stored prompt ({tag})")
        if wrong:
            overwritten += 1
            verdict.add("overwritten", f"id {rid!r}: " + "; ".join(wrong))
    verdict.counts["overwritten"] = overwritten


def _judge_bad(verdict: Verdict, expected: Expected, bad: list[tuple[Any, ...]]) -> None:
    """Every hostile line in inputs_bad with its reason; no other line there, no blank line anywhere."""
    stored = {line: reason for line, reason in bad}
    for line, needed in sorted(expected.bad.items()):
        if line not in stored:
            verdict.add("hostile line not in inputs_bad", f"line {line}: expected {needed}")
            continue
        missing = [word for word in needed if word not in stored[line]]
        if missing:
            verdict.add("inputs_bad reason wrong", f"line {line}: {stored[line]!r} lacks {missing}")
    for line in sorted(stored.keys() - expected.bad.keys()):
        verdict.add("inputs_bad line that is not bad", f"line {line}: {stored[line]!r}")
    duplicates = sum(1 for words in expected.bad.values() if words[0] == "duplicate id")
    verdict.counts.update(
        **{
            "inputs_bad expected": len(expected.bad),
            "  of which duplicates": duplicates,
            "inputs_bad found": len(stored),
        }
    )
