"""`fleet.pool.ready_endpoints`: the tunnels (and the SSH connections behind them) live exactly as long as the
block that opened them, over a real sshd to a deployed `fleetgen.sim` (SGLang cannot start without a GPU).
A fleet's view reads the model's shape on its first host, as `plan` and `up` do (the dashboard's plan)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from fleetgen.dashboard.fleetdata import planned_max_running_requests
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.errors import FleetDown
from fleetgen.fleet.pool import ready_endpoints
from fleetgen.fleet.status import open_view
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.test_sglang import QWEN36, sim_fleet


async def _health(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/health") as resp:
        return resp.status


async def test_tunnels_close_when_the_block_exits_and_not_before(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    fleet = Fleet.load(sim_fleet(tmp_path, ssh_hosts[:1], gpus=(0, 1)))
    try:
        outcomes = await up(fleet)
        assert [o.error for o in outcomes] == [None, None]
        async with ready_endpoints(fleet) as endpoints:
            assert sorted(e.name for e in endpoints) == ["h0-0", "h0-1"]
            urls = [e.url for e in endpoints]
            ports = {inst.port for inst in fleet.file.instances()}
            # the URLs are tunnels (local forwards), not the engines' own ports
            assert all(int(url.rsplit(":", 1)[1]) not in ports for url in urls)
            for url in urls:
                assert await _health(url) == 200
        for url in urls:  # the block is over: its forwards are gone with their connections
            with pytest.raises(aiohttp.ClientConnectionError):
                await _health(url)

        # A second block opens its own tunnels: nothing was kept from the first.
        async with ready_endpoints(fleet, only=["h0-1"]) as [again]:
            assert again.name == "h0-1" and await _health(again.url) == 200
        with pytest.raises(aiohttp.ClientConnectionError):
            await _health(again.url)
    finally:
        await down(fleet)
    with pytest.raises(FleetDown, match="no instance of the fleet is ready"):
        async with ready_endpoints(fleet):
            pass


async def test_the_dashboards_plan_reads_the_model_on_the_fleets_host(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    # engine.model is the folder on the hosts (sshd hosts are this machine); no model_config: only a read
    # over the host's connection can find it.
    fleet = Fleet.load(sim_fleet(tmp_path, ssh_hosts[:1], gpus=(0, 1), model=QWEN36))
    async with open_view(fleet) as view:
        planned, note = await planned_max_running_requests(fleet, view.model_host)
    assert note == "" and sorted(planned) == ["h0-0", "h0-1"]
