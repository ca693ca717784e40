"""`bench/driver/`'s pure parts: which part a task's CPU is charged to, the loops it runs, its medians.

The driver bench itself needs a thousand ports and minutes of CPU (the lead runs it on the GPU machine);
what decides its numbers is checked here on real coroutines and real result records' shapes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "bench" / "driver"), str(ROOT / "bench")]

import driver  # noqa: E402  (bench/driver/driver.py)
import run_driver  # noqa: E402  (bench/driver/run_driver.py)

THIS = "bench/test_driver_bench.py"  # where the coroutines below are defined


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()


async def _middle(gate: asyncio.Event) -> None:
    await _innermost(gate)


async def _outer(gate: asyncio.Event) -> None:
    await _middle(gate)


def test_a_task_is_found_inside_a_coroutine_at_any_depth_of_its_await_chain() -> None:
    """`Dispatcher.run` is awaited by the job's own task three coroutines down (run → _run → _execute):
    the charge walks the whole chain, not the task's own coroutine alone."""

    async def check() -> dict[str, bool]:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate))
        await asyncio.sleep(0)  # the task runs up to its wait
        coro = task.get_coro()
        found = {name: driver._awaits(coro, (THIS, name)) for name in ("_outer", "_middle", "_innermost")}
        found["elsewhere"] = driver._awaits(coro, ("generate/dispatch.py", "_innermost"))
        found["no such"] = driver._awaits(coro, (THIS, "check"))
        gate.set()
        await task
        found["after"] = driver._awaits(task.get_coro(), (THIS, "_innermost"))
        return found

    found = asyncio.run(check())
    assert found == {
        "_outer": True,
        "_middle": True,
        "_innermost": True,
        "elsewhere": False,
        "no such": False,
        "after": False,
    }


def _result(loop: str, scrape: str, ms: float) -> dict[str, Any]:
    return {"loop": loop, "scrape": scrape, "cpu_ms_per_completion": ms}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["asyncio", "uvloop"]),
            st.sampled_from(["off", "new", "old"]),
            st.floats(min_value=0.01, max_value=50.0),
        ),
        max_size=30,
    )
)
def test_each_loop_and_scrape_gets_the_median_of_its_own_runs(runs: list[tuple[str, str, float]]) -> None:
    results = [_result(*run) for run in runs]
    medians = run_driver.per_completion(results)
    pairs = {(loop, scrape) for loop, scrape, _ in runs}
    assert {(loop, scrape) for loop, by in medians.items() for scrape in by} == pairs
    for loop, scrape in pairs:
        mine = [ms for lp, sc, ms in runs if (lp, sc) == (loop, scrape)]
        assert medians[loop][scrape] == statistics.median(mine)


@given(
    runs=st.lists(
        st.tuples(st.sampled_from(["main", "lean"]), st.sampled_from(["off", "new"]), st.floats(0.01, 50.0)),
        max_size=30,
    )
)
def test_each_source_of_an_a_b_gets_the_median_of_its_own_runs(runs: list[tuple[str, str, float]]) -> None:
    results = [_result(run_driver.column("asyncio", src), scrape, ms) for src, scrape, ms in runs]
    medians = run_driver.per_completion(results)
    for src, scrape in {(src, scrape) for src, scrape, _ in runs}:
        mine = [ms for sr, sc, ms in runs if (sr, sc) == (src, scrape)]
        assert medians[f"asyncio@{src}"][scrape] == statistics.median(mine)
    assert run_driver.column("asyncio", "this") == "asyncio"  # no --src: the loop's own column


@pytest.mark.parametrize("installed", [True, False])
def test_uvloop_runs_only_where_it_is_installed(installed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (real("asyncio") if installed else None) if name == "uvloop" else real(name, *a),
    )
    asked = ["uvloop", "asyncio"]
    assert run_driver.available_loops(asked) == (asked if installed else ["asyncio"])
