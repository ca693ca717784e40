"""`generate.heap`: the collector's settings while a job dispatches, and the process's own after it.

The CPU it saves is measured by bench/driver (no timing here); what a test can hold: what was garbage at the
start is collected, not frozen; what is alive is frozen; young collections are rarer; after the block (or a
job, against the simulated SGLang server, a real process) the process's settings are as they were, so a
library caller, tune's next job or the next test sees no change."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from fleetgen.generate.heap import YOUNG_THRESHOLD, frozen_heap
from fleetgen.generate.progress import Progress
from tests.fixtures.jobs import new_job, write_jsonl
from tests.fixtures.sim import SimFactory


class Node:
    """A container object that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: object = self


def test_the_block_freezes_what_lives_collects_what_does_not_and_restores_the_settings() -> None:
    before = (gc.get_threshold(), gc.get_freeze_count())
    garbage, alive = Node(), Node()  # a cycle each; one dropped: only the collector can free it
    dropped = weakref.ref(garbage)
    del garbage
    with frozen_heap():
        assert dropped() is None  # collected at the start, not frozen with the living
        assert gc.get_freeze_count() > 0
        assert not any(obj is alive for obj in gc.get_objects())  # frozen: out of every generation
        assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0][0])
        assert gc.get_threshold()[1:] == before[0][1:]
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    assert any(obj is alive for obj in gc.get_objects())  # back in the collector's view


async def test_a_job_dispatches_with_the_heap_frozen_and_gives_the_settings_back(
    tmp_path: Path, sim_server: SimFactory
) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(20)])
    before = (gc.get_threshold(), gc.get_freeze_count())
    during: list[tuple[int, int]] = []

    def seen(_: Progress) -> None:
        during.append((gc.get_threshold()[0], gc.get_freeze_count()))

    async with sim_server(sim_output_tokens=8) as sim:
        summary = await new_job(tmp_path, prompts, [sim.base_url]).run(seen)
    assert summary.results == 20
    assert during and all(threshold >= YOUNG_THRESHOLD and frozen > 0 for threshold, frozen in during)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
