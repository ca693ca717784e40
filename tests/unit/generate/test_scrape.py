"""`generate.scrape.MetricsScraper.run`: every endpoint read once an interval, each at its own moment of it
(the k-th of N at k/N: a thousand pages never read in one burst beside the dispatch), and never twice at
once (a slow server's read still under way is skipped, not piled up).

The clock and the sleeps are the test's (a fake clock: the loop's own would make this a timing test); the
reads are recorded, not sent (what a read does is tests/unit/generate/test_health_progress.py's)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fleetgen.generate.scrape as scrape_module
from fleetgen.generate.scrape import MetricsScraper
from fleetgen.http.client import EngineClient


class Clock:
    """monotonic() and sleep() of a clock that moves only when slept on; the scraper module's `time` and
    `asyncio` (only there: the loop keeps its own)."""

    def __init__(self, overshoot_s: float = 0.0) -> None:
        self.now = 0.0
        self.overshoot_s = overshoot_s  # a busy loop: every sleep ends this much late
        self.num_sleeps = 0
        self.until = float("inf")
        self.passed = asyncio.Event()  # the clock reached `until`

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)  # what was started before the sleep runs at the time it was started
        self.now += max(seconds, 0.0) + self.overshoot_s
        self.num_sleeps += 1
        if self.now >= self.until:
            self.passed.set()

    def __getattr__(self, name: str) -> Any:  # as the scraper's `asyncio`: the rest is asyncio's
        return getattr(asyncio, name)


async def _reads(
    num: int, interval_s: float, until_s: float, slow: set[str], monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> list[tuple[float, str]]:
    """(when, name) of each read started before `until_s` by a scraper of `interval_s`; the `slow` ones'
    reads never end."""
    monkeypatch.setattr(scrape_module, "time", clock)
    monkeypatch.setattr(scrape_module, "asyncio", clock)
    started: list[tuple[float, str]] = []
    names = [(f"s{i}", f"http://127.0.0.1:{9000 + i}") for i in range(num)]
    scraper = MetricsScraper(lambda: names, "sglang", interval_s=interval_s, api_key=None)

    async def read(name: str, client: EngineClient) -> None:
        started.append((clock.now, name))
        if name in slow:
            await asyncio.Event().wait()  # a server that never answers (within these rounds)

    monkeypatch.setattr(scraper, "_scrape", read)
    task = asyncio.create_task(scraper.run())
    clock.until = until_s
    await clock.passed.wait()  # the scraper's sleeps move the clock
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return [(at, name) for at, name in started if at < until_s]


@settings(max_examples=25, deadline=None)
@given(num=st.integers(1, 40), interval_s=st.sampled_from([1.0, 3.0, 7.5]), data=st.data())
def test_each_endpoint_is_read_once_an_interval_at_its_own_moment(
    num: int, interval_s: float, data: Any
) -> None:
    slow = set(data.draw(st.lists(st.sampled_from([f"s{i}" for i in range(num)]), unique=True)))
    budget = data.draw(st.sampled_from([100.0, 5.0]))  # pages a second: 5 stretches the larger fleets' rounds
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scrape_module, "MAX_PAGES_PER_S", budget)
        round_s = max(interval_s, num / budget)  # never more than `budget` pages a second
        reads = asyncio.run(_reads(num, interval_s, 3 * round_s, slow, patch, Clock()))
    for k in range(num):
        name = f"s{k}"
        times = [at for at, n in reads if n == name]
        # round r reads the k-th at r·interval + k/N of it; a slow one only once (its read never ended)
        want = [r * round_s + k * round_s / num for r in range(1 if name in slow else 3)]
        assert times == pytest.approx(want), (name, times, want)


@settings(max_examples=15, deadline=None)
@given(num=st.integers(2, 60))
def test_a_busy_loop_starts_the_reads_fallen_due_at_once(num: int) -> None:
    """Every sleep ends a whole interval late (a loop turn that long): each round still reads every
    endpoint, with two sleeps a round, not one per endpoint (each would cost a loop turn)."""
    clock = Clock(overshoot_s=3.0)
    with pytest.MonkeyPatch.context() as patch:
        reads = asyncio.run(_reads(num, 3.0, 36.0, set(), patch, clock))
    rounds = sum(1 for _, name in reads if name == "s0")
    assert rounds >= 2
    for k in range(num):
        assert sum(1 for _, name in reads if name == f"s{k}") in (rounds, rounds - 1)  # the last may be cut
    assert clock.num_sleeps <= 2 * rounds + 2
