"""An open, surveyed host (`HostSession`, `open_session`): a fleet host, a Slurm node or a Ray node, with
what fleetgen learned of it during this command, and where its instances' ports are reached."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from fleetgen.config import LOOPBACK, EngineConfig, HostEntry
from fleetgen.deploy.hostsurvey import HostSurvey, prepare_host
from fleetgen.deploy.types import WantedInstance
from fleetgen.errors import ConfigError
from fleetgen.http.client import EngineClient
from fleetgen.remote import open_host
from fleetgen.remote.base import Host


@dataclass
class HostSession:
    """An open host with what fleetgen learned about it during this command."""

    entry: HostEntry
    host: Host
    survey: HostSurvey
    http: aiohttp.ClientSession
    public_bind: str | None = None

    async def url_for(self, port: int) -> str:
        """Where fleetgen reaches a port: a local SSH forward, or directly on a public bind: its address, or,
        bound to every interface, the host's SSH address (a `local` host, whose address is the word "local",
        at its own loopback)."""
        bind, wildcard = self.public_bind, {"0.0.0.0": "127.0.0.1", "::": "[::1]"}
        if not bind:
            return f"http://127.0.0.1:{await self.host.forward(port)}"
        if bind in wildcard:
            address = wildcard[bind] if self.entry.is_local else self.entry.address
        else:
            address = f"[{bind}]" if ":" in bind else bind
        return f"http://{address}:{port}"

    async def client_for(self, wanted: WantedInstance) -> EngineClient:
        """The engine client of an instance on this host, with its key."""
        url = await self.url_for(wanted.inst.port)
        return EngineClient(url, session=self.http, api_key=wanted.secret_value)


@contextlib.asynccontextmanager
async def open_session(
    entry: HostEntry,
    cfg: EngineConfig,
    http: aiohttp.ClientSession,
    *,
    check_launch: bool = True,
    host: Host | None = None,
) -> AsyncIterator[HostSession]:
    """`entry` connected (`host`, else `open_host(entry)`) and surveyed (`prepare_host`); closes the
    connection (and its tunnels) on exit. A loopback bind other than 127.0.0.1 on an SSH host is the HOST's
    loopback, reached neither directly nor through tunnels (they go to 127.0.0.1): refused first."""
    if not entry.is_local and cfg.bind != LOOPBACK and is_loopback(cfg.bind):
        raise ConfigError(
            f"engine.bind = {cfg.bind!r} is {entry.name}'s own loopback: fleetgen cannot reach a server "
            "there",
            fix="keep engine.bind = '127.0.0.1' (reached through SSH tunnels), or bind '0.0.0.0' or an "
            "address of the host with engine.api_key_env set",
            context={"host": entry.name},
        )
    async with host or open_host(entry) as host:
        survey = await prepare_host(host, entry, cfg, check_launch=check_launch)
        yield HostSession(entry, host, survey, http, public_bind=cfg.bind if cfg.is_public else None)


def is_loopback(address: str) -> bool:
    """`localhost` or a loopback IP (127.0.0.0/8, ::1)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
