"""What the placements that start each server on its own (a Slurm job, a Ray actor) share: the job script
that becomes the engine, the name of an instance's placement, and the engine's PID read back on the node.

The job script (`job_script`): $1 the launch script, $2 the launch's new log, $3 the pidfile. `set -C`: the
log must be new; `umask 077`: the log and pidfile are the owner's only; it writes its own PID, then `exec`s
the launch script, so the process the placement started becomes the engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

from fleetgen.deploy.session import HostSession
from fleetgen.deploy.types import WantedInstance
from fleetgen.errors import LaunchFailed

PIDFILE_WAIT_S = 60.0

_BODY = r"""set -C
umask 077
script=$1 log=$2 pidfile=$3
mkdir -p -- "$(dirname -- "$log")" || exit 73
: > "$log" || exit 73
exec >> "$log" 2>&1 < /dev/null
echo "fleetgen: BANNER on $(hostname), pid $$"
tmp="$pidfile.$$.tmp"
{ printf '%s\n' "$$" > "$tmp" && mv -f -- "$tmp" "$pidfile"; } || exit 74
exec "$script"
"""


def job_script(banner: str, head: str = "") -> str:
    """The job script, its first log line naming the placement (`banner`, shell expansions allowed), after
    `head` (a shebang and a comment where it is a file)."""
    return head + _BODY.replace("BANNER", banner)


def placement_name(prefix: str, fleet_path: Path, instance: str) -> str:
    """An instance's job or actor name: unique per fleet file, so `down` finds every one of the fleet's."""
    tag = hashlib.sha256(str(fleet_path.resolve()).encode()).hexdigest()[:8]
    return f"{prefix}-{instance}-{tag}"


async def engine_pid(
    node: HostSession, wanted: WantedInstance, mark: tuple[str, str], missing: str, fix: str
) -> tuple[int, int]:
    """The PID the job script wrote (it became the engine) and its start time, read on the node; the process
    must carry the placement's mark (`mark`: a variable of its environment and its value), since a stale
    pidfile names another. `missing` says what started without showing up, `fix` what to read."""
    pidfile, deadline = wanted.command.paths.pidfile, time.monotonic() + PIDFILE_WAIT_S
    variable, value = mark
    while True:
        text = (await node.host.run(["cat", "--", pidfile], check=False)).stdout.strip()
        if text.isdigit():
            info = await node.host.inspect(int(text))
            if info.environ.get(variable) == value:
                return info.pid, info.start_time
        if time.monotonic() > deadline:
            raise LaunchFailed(
                f"{wanted.inst.name}: {missing}, but its process did not show up on the node "
                f"({pidfile} names {text or 'nothing'})",
                fix=fix,
            )
        await asyncio.sleep(0.2)
