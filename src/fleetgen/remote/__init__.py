"""fleetgen.remote: the `Host` interface; `LocalHost` and `SshHost` (and `srun.SrunHost`, a Slurm node).

`open_host(entry)` picks one for a fleet file's `[[hosts]]` entry; use it as an async context manager:

    async with open_host(entry) as host:
        await host.put("~/fleetgen/launch.sh", script, 0o755)
"""

from __future__ import annotations

from fleetgen.config import HostEntry
from fleetgen.remote.base import Host, HostState, ProcState
from fleetgen.remote.local import LocalHost
from fleetgen.remote.ssh import SshHost

__all__ = [
    "Host",
    "HostState",
    "LocalHost",
    "ProcState",
    "SshHost",
    "open_host",
]


def open_host(entry: HostEntry) -> Host:
    """The Host for one `[[hosts]]` entry (not connected yet: `async with open_host(entry) as host`)."""
    if entry.is_local:
        return LocalHost(entry.name)
    return SshHost(entry)
