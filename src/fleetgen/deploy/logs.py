"""Read an instance's current log (`<workdir>/<instance>/logs/current.log`) on its host: tail or follow."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import host_instances
from fleetgen.deploy.script import InstancePaths
from fleetgen.deploy.session import open_session
from fleetgen.errors import ConfigError


async def read_log(
    fleet: Fleet, name: str, num_lines: int = 100, *, follow: bool = False
) -> AsyncIterator[str]:
    """The last `num_lines` lines of the instance's current log; with `follow`, then every new line."""
    entry = fleet.file.host_of_instance(name)
    async with (
        aiohttp.ClientSession() as http,
        open_session(entry, fleet.file.engine, http, check_launch=False) as hs,
    ):
        if name not in {i.name for i in await host_instances(fleet, hs)}:
            raise ConfigError(
                f"no instance named {name!r} on host {entry.name}",
                fix="`fleetgen status` lists the instances",
            )
        path = InstancePaths.of(hs.survey.workdir, name).current_log
        if not await hs.host.exists(path):
            raise ConfigError(
                f"{name} has no log yet ({path} does not exist on {entry.name})",
                fix="start it with `fleetgen up`",
            )
        if follow:  # one `tail -F -n N`: a tail then a follow would lose the lines written in between
            async for line in hs.host.follow(path, last=num_lines):
                yield line
            return
        for line in (await hs.host.tail(path, num_lines)).splitlines():
            yield line
