"""The stand-in chat server (tests/fixtures/standin.py): its markers parse as fleetgen.sim spells them."""

from __future__ import annotations

from tests.fixtures.standin import parse_marks


def test_marks_parse_like_the_sim_spells_them() -> None:
    assert parse_marks("x [[sim:status=429:times=2]] y [[sim:finish=length]]") == {
        "status": "429",
        "times": "2",
        "finish": "length",
    }
    assert parse_marks("plain") == {}
