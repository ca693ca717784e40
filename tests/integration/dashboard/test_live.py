"""`fleetgen dashboard` in headless Chromium against a running job on a simulated fleet.

Real processes throughout: three `fleetgen.sim` servers (SGLang cannot run here without a GPU, hence the
simulation; its HTTP surface and metrics are SGLang's), a real `fleetgen run` writing its store, a real
`fleetgen dashboard` serving 127.0.0.1, and Debian's Chromium loading the page and running its script.
Screenshots are kept in the test's tmp folder (printed) so a human can look at them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fixtures.chromium import dump_dom, need_chromium, screenshot
from tests.fixtures.ports import free_port

NUM_INSTANCES = 3
HANG_GUARD_S = 120.0  # only against a hung test; never asserted as a speed


@contextlib.asynccontextmanager
async def fleetgen(*argv: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run `fleetgen ARGV` (its own process group) for the block; SIGTERM then SIGKILL it after."""
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from fleetgen.cli import main; main()",
            *argv,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], logs: list[Path]) -> Any:
    """Poll `check` until it returns something truthy; fail with the logs after the hang guard."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)
            pytest.fail(f"gave up waiting for {what}\n{tails}")
        await asyncio.sleep(0.5)


async def get_state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "api/state") as resp:
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = await resp.json()
        return data


def done_count(dom: str) -> int:
    match = re.search(r'<span id="done">([\d,]+)</span>', dom)
    assert match, "no done counter in the page"
    return int(match.group(1).replace(",", ""))


def fleet_rows(dom: str) -> list[str]:
    table = re.search(r'<table id="fleet-table".*?</table>', dom, re.S)
    assert table, "no fleet table in the page"
    return re.findall(r'<tr class="instance[^"]*"[^>]*>', table.group(0))


def chart(dom: str, element_id: str) -> str:
    match = re.search(rf'<div id="{element_id}">(<svg.*?</svg>)</div>', dom, re.S)
    assert match, f"chart {element_id} missing"
    return match.group(1)


def num_points(svg: str) -> int:
    """Points of the first line of a chart (0 when it has none): a line needs two to be seen."""
    match = re.search(r'<polyline class="series"[^>]* points="([^"]*)"', svg)
    return len(match.group(1).split()) if match else 0


def write_input(path: Path, num: int) -> Path:
    path.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"Explain item {i}."}) + "\n" for i in range(num))
    )
    return path


async def test_dashboard_follows_a_running_job_and_flags_a_killed_instance(
    sim_server: Any, tmp_path: Path
) -> None:
    need_chromium()
    sim_flags = dict(
        enable_metrics=True,
        speculative_algorithm="NGRAM",
        speculative_num_draft_tokens=4,
        sim_decode_tps=60,
        sim_output_tokens=120,
    )
    out, port = tmp_path / "out", free_port()
    logs = [tmp_path / "run.log", tmp_path / "dashboard.log"]
    async with contextlib.AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(sim_server(**sim_flags)) for _ in range(NUM_INSTANCES)]
        endpoints = [arg for s in sims for arg in ("--endpoint", s.base_url)]
        inputs = write_input(tmp_path / "in.jsonl", 5000)
        await stack.enter_async_context(
            fleetgen(
                "run", str(inputs), "-o", str(out), *endpoints, "--concurrency", "4", "--no-live", log=logs[0]
            )
        )
        await stack.enter_async_context(
            fleetgen("dashboard", "-o", str(out), *endpoints, "--port", str(port), log=logs[1])
        )
        url = f"http://127.0.0.1:{port}/"
        http = await stack.enter_async_context(aiohttp.ClientSession())

        async def has_series() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                state = await get_state(http, url)
                return num_points(state["fragments"]["chart-tokens-total"]) >= 2
            return False

        await wait_for("the dashboard to serve a non-empty throughput chart", has_series, logs)
        dom1 = await dump_dom(url, budget_ms=4000)
        await screenshot(url, tmp_path / "dashboard-1.png", width=1400, height=1700, budget_ms=4000)
        check_first_paint(dom1)

        first = done_count(dom1)

        await wait_for("the done counter to move", lambda: _done_above(http, url, first), logs)
        dom2 = await dump_dom(url, budget_ms=4000)
        second = done_count(dom2)
        assert second > first, (first, second)

        name = await kill_and_wait_sick(sims[1], http, url, logs)
        dom3 = await dump_dom(url, budget_ms=4000)
        await screenshot(url, tmp_path / "dashboard-2.png", width=1400, height=1700, budget_ms=4000)
        sick_rows = [row for row in fleet_rows(dom3) if "sick" in row]
        assert len(sick_rows) == 1 and f'data-instance="{name}"' in sick_rows[0], sick_rows
        assert "1 SICK" in dom3
        print(f"screenshots: {tmp_path / 'dashboard-1.png'} {tmp_path / 'dashboard-2.png'}")


async def _done_above(http: aiohttp.ClientSession, url: str, floor: int) -> bool:
    state = await get_state(http, url)
    return int(state["numbers"]["done"].replace(",", "")) > floor


def check_first_paint(dom: str) -> None:
    """One healthy row per instance, the script polling, every rate chart drawn as a line, result charts."""
    rows = fleet_rows(dom)
    assert len(rows) == NUM_INSTANCES, rows
    assert all('data-health="ready"' in row and "sick" not in row for row in rows), rows
    polls = re.search(r'data-polls="(\d+)"', dom)
    assert polls and int(polls.group(1)) >= 1, "the page script never polled /api/state"
    for element_id in ("chart-tokens-total", "chart-tokens", "chart-completions-total", "chart-completions"):
        assert num_points(chart(dom, element_id)) >= 2, element_id
    assert 'class="bin"' in chart(dom, "chart-lengths")
    assert 'class="bar"' in chart(dom, "chart-finish")


async def kill_and_wait_sick(victim: Any, http: aiohttp.ClientSession, url: str, logs: list[Path]) -> str:
    """SIGKILL one simulated server mid-run; wait until the dashboard's state calls it sick. Its name."""
    name = str(victim.base_url).split("://", 1)[1]
    killed_at = time.monotonic()
    os.killpg(victim.process.pid, signal.SIGKILL)

    async def victim_sick() -> bool:
        state = await get_state(http, url)
        return any(i["name"] == name and i["sick"] for i in state["instances"])

    await wait_for(f"{name} to show as unhealthy", victim_sick, logs)
    print(f"killed instance shown unhealthy after {time.monotonic() - killed_at:.1f} s")
    return name


async def test_the_ssh_forward_it_prints_names_the_port_it_bound(tmp_path: Path) -> None:
    """`--port 0` lets the system pick: the `ssh -L` line must name that port (it printed `0:127.0.0.1:0`)."""
    log = tmp_path / "dashboard.log"
    async with fleetgen("dashboard", "-o", str(tmp_path / "out"), "--port", "0", log=log):

        async def printed_forward() -> re.Match[str] | None:
            return re.search(r"ssh -L (\d+):127\.0\.0\.1:(\d+) THIS_HOST, then open (\S+)", log.read_text())

        found = await wait_for("the dashboard to print how to reach it", printed_forward, [log])
        local, remote, url = int(found[1]), int(found[2]), found[3]
        assert local == remote == int(url.rsplit(":", 1)[1].strip("/")) > 0
        async with aiohttp.ClientSession() as http, http.get(url) as answer:
            assert answer.status == 200
