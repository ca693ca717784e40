"""`atomic.write_atomic`, the one writer of `.fleetgen/state.json` and `report`'s HTML: the file is the old
text or the new one, whole, never a mix, and no temp file is left beside it, whatever the text."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.atomic import write_atomic

TEXTS = st.text(st.characters(exclude_categories=["Cs"]))  # any text UTF-8 can hold


@given(old=TEXTS, new=TEXTS, name=st.sampled_from(["state.json", "report.html", ".hidden", "a b ü.tmp"]))
def test_the_file_holds_exactly_the_last_text_and_nothing_else_is_left(
    tmp_path_factory: pytest.TempPathFactory, old: str, new: str, name: str
) -> None:
    folder = tmp_path_factory.mktemp("w") / "not" / "yet"  # the folders are made
    path = folder / name
    write_atomic(path, old)
    write_atomic(path, new)
    assert path.read_bytes() == new.encode("utf-8")  # newlines as given, no translation
    assert os.listdir(folder) == [name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # state and reports are the user's alone


@given(old=TEXTS, bad=st.text(min_size=1).map(lambda t: t + "\ud800"))  # a lone surrogate: no UTF-8
def test_a_failed_write_leaves_the_old_file_whole_and_no_temp_file(
    tmp_path_factory: pytest.TempPathFactory, old: str, bad: str
) -> None:
    path = tmp_path_factory.mktemp("w") / "state.json"
    write_atomic(path, old)
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, bad)
    assert path.read_bytes() == old.encode("utf-8")
    assert os.listdir(path.parent) == ["state.json"]
