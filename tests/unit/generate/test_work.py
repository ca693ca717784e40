"""`generate.work`: a turn's text (multi-turn history from the model's own answers)."""

from __future__ import annotations

from fleetgen.generate.work import Record, Work
from fleetgen.http.client import Completion


def test_multi_turn_history_uses_the_models_answers() -> None:
    segments = [[{"role": "user", "content": "u1"}], [{"role": "user", "content": "u2"}]]
    work = Work(Record("w", "f", 1, 0, segments), 0)
    work.done.append(Completion("a1", "r1", "stop", 1, 1))
    assert work.messages_for_next_turn() == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
    ]
