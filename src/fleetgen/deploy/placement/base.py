"""The placement seam: what places a fleet's servers (SSH hosts, a Slurm cluster, a Ray cluster), as one
small protocol every placement module implements (`Placement`), and where a server runs now (`Placed`).

A command gets its fleet's placement once (`deploy.placement.placement_of`) and calls it; nothing outside
`deploy/placement/` asks which placement a fleet has. Every placement hands the SAME rendered launch script
to the node and the SAME chain verifies it there (`deploy.instance.follow_launch` / `keep_running`): the
node is reached as a `remote.base.Host` (SSH, a Slurm job step, a Ray task pinned to the node).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetgen.config import FleetFile, HostEntry, Instance
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.session import HostSession
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.types import InstanceCommand, Outcome, Rollout, Say, WantedInstance
from fleetgen.plan import GpuFacts, Issue


@dataclass
class Placed:
    """Where an instance runs now: its node's session (its server is placed there), or why it is not."""

    inst: Instance
    node: HostSession | None
    where: str = ""  # "Slurm job 12 on node1", "Ray actor fleetgen-ray-0 on node 10.0.0.2"; "" on a host
    has_ended: bool = False  # its placement ended (or none was made): `up` or --restart-dead places it
    placement_id: str = ""  # the job / actor whose node `node` is ("" on SSH hosts)


@dataclass(frozen=True)
class Offered:
    """What a placement offers `plan` online in place of its host's own survey: the GPUs (one per slot),
    notes, and the engine releases its nodes report (one each, None where a node reports none); `None`:
    the host's own release (its servers run there, or on nodes that share its files)."""

    gpus: tuple[GpuFacts, ...]
    notes: list[Issue]
    engine_versions: tuple[str | None, ...] | None = None


class Placement(Protocol):
    """What places the servers of a fleet, registered by `kind` (`[cluster] kind`, "hosts" for
    `[[hosts]]`). `login` is the session of the fleet's host entry: an SSH host, or the host a cluster
    stands as (Slurm's submit host, Ray's driver: this machine)."""

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str:
        """What it is in a sentence: "SSH hosts", "a Slurm cluster", "a Ray cluster"."""
        ...

    @property
    def is_per_instance(self) -> bool:
        """Each server placed on its own (a job, an actor), so a server may move: re-read alone, it is placed
        anew; False: a host's servers are read through the host's one session."""
        ...

    @property
    def launches_on_login(self) -> bool:
        """Its servers launch where `login` stands, or on nodes that share its files (Slurm's submit host), so
        `up` refuses an engine's python or model folder missing there before anything is placed; False: on
        nodes it reaches itself, which its `launch_survey` reads (Ray: the nodes it may place on)."""
        ...

    @property
    def can_tune(self) -> bool:
        """`tune` measures on it (it launches each candidate as its own fleet on the same GPUs)."""
        ...

    async def launch_survey(self, fleet: Fleet, login: HostSession, say: Say) -> HostSurvey:
        """What `up` decides its servers' launch by (`deploy.wanted`: argv by the engine version, paths by the
        resolved workdir, the GPUs and RAM planned): `login.survey` where they launch there (or on nodes
        that share its files); else what the nodes it places on run, raising for a node that cannot launch
        them (Ray: `raynodes`). `say`: a line for the user while it waits (Ray: a connection tried again)."""
        ...

    async def preflight(self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance]) -> None:
        """Refuse before anything is placed what the placement would refuse (raise naming the fix)."""
        ...

    async def up(
        self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance], run: Rollout
    ) -> list[Outcome]:
        """Each server kept (running as wanted), or (re)placed and verified; an Outcome each."""
        ...

    async def down(
        self,
        fleet: Fleet,
        login: HostSession,
        targets: Sequence[InstanceCommand],
        records: dict[str, InstanceRecord],
    ) -> list[Outcome]:
        """Each server stopped, its placement released, and nothing of it left on its node."""
        ...

    async def place(
        self,
        fleet: Fleet,
        login: HostSession,
        instances: Sequence[Instance],
        records: dict[str, InstanceRecord],
        stack: contextlib.AsyncExitStack,
    ) -> list[Placed]:
        """Where each instance runs now; the nodes' sessions opened on `stack`."""
        ...

    async def planning_gpus(self, fleet_file: FleetFile, entry: HostEntry) -> Offered | None:
        """What it offers `plan` online in place of the host's own survey (`Offered`); None: the host's
        own, as its survey read them."""
        ...
