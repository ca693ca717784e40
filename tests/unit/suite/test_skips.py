"""A real component missing is skipped here and fails CI: one reading of `CI`, one place that skips.

CI services set `CI` as true, 1 or yes; a fixture reading it another way (`== "true"`) would skip under
`CI=1` and CI would go green on a run that proved nothing. The grep half keeps every skip going through
`tests.fixtures.skip_or_fail`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures import is_ci, skip_or_fail

TESTS = Path(__file__).parents[2]
# A skip that does not fail under CI, or a second reading of the variable.
SILENT = re.compile(
    r"pytest\.skip\(|importorskip\(|mark\.skip\b|environ(\.get)?\(\s*[\"']CI[\"']|\[[\"']CI[\"']\]"
)
# Named exceptions, each with why: (file, what it skips).
ALLOWED: set[tuple[str, str]] = set()  # none left: the timeline checks read CI's installed SGLang source


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", True),
        ("1", True),
        ("yes", True),
        ("TRUE", True),
        (" True ", True),
        ("", False),
        ("0", False),
        ("false", False),
        ("no", False),
    ],
)
def test_ci_is_read_one_way(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert is_ci() is expected


def test_a_missing_component_skips_here_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="sshd: apt-get install"):
        skip_or_fail("sshd", "apt-get install openssh-server")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI=1 and sshd is missing: apt-get install"):
        skip_or_fail("sshd", "apt-get install openssh-server")


def test_every_skip_goes_through_skip_or_fail() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        if name in ("fixtures/__init__.py", "unit/suite/test_skips.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SILENT.search(line) or ("skipif(" in line and (name, "skipif") not in ALLOWED):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "skip through tests.fixtures.skip_or_fail (it fails under CI):\n" + "\n".join(found)
