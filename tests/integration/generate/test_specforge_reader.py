"""The SpecForge oracle's one long-lived reader (tests/fixtures/specforge_serve.py): it answers exactly what
the check script prints when run as its own process, a failed check comes back as a failure with its
traceback, and one process serves every check of a worker (torch and SpecForge imported once)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.specforge_oracle import READER, TEMPLATE, read_with_specforge, specforge_tools

pytestmark = pytest.mark.specforge

CHECK = Path(__file__).resolve().parents[2] / "fixtures" / "specforge_check.py"

ROWS = [
    {
        "id": "a",
        "conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}],
    },
    {
        "id": "b\u2028",  # a line separator in an id: the answers are JSON lines, not text lines
        "conversations": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Two turns?"},
            {"role": "assistant", "content": "One."},
            {"role": "user", "content": "And?"},
            {"role": "assistant", "content": "Two.\n\nprint('not on stdout')"},
        ],
    },
]


def test_the_reader_answers_as_the_script_run_alone_and_lives_on_after_a_failed_check(tmp_path: Path) -> None:
    specforge = specforge_tools()
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    alone = subprocess.run(
        [specforge[0], str(CHECK), str(path), str(specforge[1]), TEMPLATE],
        capture_output=True,
        text=True,
        check=True,
    )
    served = read_with_specforge(path, specforge)
    assert served == [json.loads(line) for line in alone.stdout.splitlines()]
    assert [v["id"] for v in served] == ["a", "b\u2028"]
    assert READER.proc is not None
    pid = READER.proc.pid
    failed = READER.run(specforge[0], "check", str(tmp_path / "missing.jsonl"), str(specforge[1]), TEMPLATE)
    assert failed.returncode != 0 and "FileNotFoundError" in failed.stderr, failed
    assert read_with_specforge(path, specforge) == served
    assert READER.proc.pid == pid  # the same process answered every check
