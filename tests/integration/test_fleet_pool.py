"""`fleet.pool.ready_endpoints`: the tunnels (and the SSH connections behind them) live exactly as long as the
block that opened them, over a real sshd to a deployed `fleetgen.sim` (SGLang cannot start without a GPU)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from fleetgen.deploy.fleetops import down, up
from fleetgen.deploy.wanted import Fleet
from fleetgen.errors import FleetDown
from fleetgen.fleet.pool import ready_endpoints
from tests.fixtures.sshd import SshdHost
from tests.integration.test_deploy_sglang import sim_fleet


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
