"""What runs ON a Ray node for fleetgen, shipped to it by value (stdlib only: the node needs Ray and a Python,
never fleetgen): one command run to its end (`run_command`, the transport of `remote.ray.RayHost`) and the
detached actor that holds one server's placement group bundle and starts its launch (`ServerHolder`).

The launch is the actor's child in a session of its own, marked with `MARK` in its environment, and set to be
SIGKILLed when the actor's process dies (prctl PR_SET_PDEATHSIG): an actor killed, or its node's raylet gone,
takes its server with it, so a dead actor never leaves a server answering on its port. What the engine
itself started (its own children) carries the mark too: `down` sweeps those by it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Sequence

MARK = "FLEETGEN_RAY_SERVER"  # the holding actor's name, in the environment of everything its launch starts
_PR_SET_PDEATHSIG = 1


def run_command(argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> tuple[int, bytes, bytes]:
    """`argv` run on this node to its end: (exit status, stdout, stderr); 124 when it ran past `timeout_s`."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        return 124, exc.stdout or b"", (exc.stderr or b"") + f"timed out after {timeout_s} s".encode()
    except OSError as exc:
        return 127, b"", str(exc).encode()
    return done.returncode, done.stdout, done.stderr


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ServerHolder:
    """One server's detached actor: it holds the placement group's GPUs for as long as it lives and starts
    the server's launch (`job_sh` with the launch script, its new log and pidfile) as its child."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.child: subprocess.Popen[bytes] | None = None

    def launch(self, job_sh: str, script: str, log: str, pidfile: str, cwd: str) -> int:
        """Start the launch in `cwd` (the instance's folder); its PID (the job script's, which `exec`s the
        launch script: the engine's)."""
        env = {**os.environ, MARK: self.name}
        self.child = subprocess.Popen(
            ["/bin/sh", "-c", job_sh, "fleetgen-ray", script, log, pidfile],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return self.child.pid

    def child_exit(self) -> int | None:
        """The launch's exit status, None while it runs (or before it started)."""
        return None if self.child is None else self.child.poll()
