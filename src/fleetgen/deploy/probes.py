"""Probes of one instance's host while `up`, `down` and `restart` act on it: /proc of its recorded process and
of its pidfile's (`probe_instance`, one round trip), and the waits for a stopped engine to let go of its port
and its GPUs. Each probe is a POSIX sh snippet run with its values as positional arguments.
"""

from __future__ import annotations

import asyncio
import time

from fleetgen.deploy.listener import port_owners
from fleetgen.errors import LaunchFailed
from fleetgen.remote.base import Host, ProcInfo
from fleetgen.remote.procfs import proc_info_from_dump
from fleetgen.remote.scripts import sh

# One round trip for an instance's processes: which PID its pidfile names, and /proc of the recorded PID ($2)
# and of the pidfile's PID (each as INSPECT_SH's four base64 lines).
PROBE_SH = r"""
pidfile=$1 recorded=$2
named=$(cat -- "$pidfile" 2>/dev/null | tr -cd '0-9')
echo "$named"
for pid in "$recorded" "$named"; do
  for f in stat cmdline environ stat; do [ -n "$pid" ] && base64 -w0 "/proc/$pid/$f" 2>/dev/null; echo; done
done
exit 0
"""

# Compute processes still on GPUs $1 (comma-separated indices).
GPU_APPS_SH = 'nvidia-smi --query-compute-apps=pid --format=csv,noheader -i "$1" 2>/dev/null; exit 0'


async def probe_instance(
    host: Host, pidfile: str, recorded: tuple[int, int] | None
) -> tuple[ProcInfo | None, ProcInfo | None]:
    """/proc of the recorded (pid, start time) and of the pidfile's PID, in one round trip."""
    res = await host.run(sh(PROBE_SH, pidfile, str(recorded[0]) if recorded else ""))
    lines = (res.stdout.splitlines() + [""] * 9)[:9]
    rec = proc_info_from_dump(recorded[0], "\n".join(lines[1:5]), recorded[1]) if recorded else None
    named = int(lines[0]) if lines[0].isdigit() else None
    return rec, proc_info_from_dump(named, "\n".join(lines[5:9]), None) if named else None


async def wait_port_free(host: Host, port: int, timeout_s: float = 30.0) -> None:
    """Wait until nothing listens on `port` (a stopped engine may take a moment to release it)."""
    deadline = time.monotonic() + timeout_s
    while (await port_owners(host, port)).listeners:
        if time.monotonic() > deadline:
            raise LaunchFailed(
                f"{host.name}: port {port} is still in use {timeout_s:.0f}s after the old server was stopped",
                context={"host": host.name, "port": port},
                fix=f"find the listener (`ss -ltnp | grep :{port}` on the host) and stop it",
            )
        await asyncio.sleep(0.2)


async def wait_gpus_released(host: Host, gpus: tuple[int, ...], timeout_s: float = 60.0) -> None:
    """Where nvidia-smi exists: wait until no compute process remains on `gpus`."""
    ids = ",".join(str(g) for g in gpus)
    deadline = time.monotonic() + timeout_s
    while True:
        res = await host.run(sh(GPU_APPS_SH, ids))
        pids = [p.strip() for p in res.stdout.splitlines() if p.strip().isdigit()]
        if not pids:
            return
        if time.monotonic() > deadline:
            raise LaunchFailed(
                f"{host.name}: GPU(s) {ids} still hold processes {', '.join(pids)} "
                f"{timeout_s:.0f}s after the old server stopped",
                context={"host": host.name, "gpus": ids},
                fix="stop those processes (nvidia-smi shows them) or pick other GPUs",
            )
        await asyncio.sleep(1.0)
