"""`SrunHost`: a node of a running Slurm job, reached through `srun --overlap --jobid` on the submit host.

For clusters that refuse SSH to compute nodes: every command is a job step of the server's own job, on its
node, run by Slurm (`cluster.node_access = "srun"`). Files are written through a step's stdin; /proc is read
by a step. A server that binds the node's loopback cannot be reached from the submit host this way, so
`forward` works only where the node's address is this machine's loopback (a single-node cluster, or fleetgen
running on the node); elsewhere bind the cluster network with an API key (engine.bind + api_key_env).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from fleetgen.errors import RemoteError
from fleetgen.remote.base import Host, Output


class SrunHost(Host):
    """The node of Slurm job `job`, each command a step (`srun --overlap`) started from `submit`."""

    def __init__(self, name: str, submit: Host, job: str, *, is_here: bool) -> None:
        super().__init__(name)
        self.submit = submit
        self.job = job
        self.is_here = is_here  # the node's address is this machine's loopback: its ports are reachable

    async def _exec(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> Output:
        step = ["srun", "--overlap", f"--jobid={self.job}", "--nodes=1", "--ntasks=1", "--quiet", "--", *argv]
        self.submit._check_usable()
        return await self.submit._exec(step, stdin, timeout_s)  # the bytes as they come: a file may be binary

    async def _stream_lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        raise RemoteError(
            f"following a file on {self.name} through srun is not supported",
            fix="read it on the submit host: the workdir is on the filesystem the nodes share",
        )
        yield ""  # pragma: no cover (makes this an async generator)

    async def forward(self, remote_port: int) -> int:
        if self.is_here:
            return remote_port
        raise RemoteError(
            f"{self.name}: a server on the node's loopback cannot be reached through srun",
            fix='set cluster.node_access = "ssh" (SSH forwards to the node), or bind the cluster network: '
            'engine.bind = "0.0.0.0" with engine.api_key_env',
        )
