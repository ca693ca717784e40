"""Servers on SSH hosts (`[[hosts]]`, the placement without a `[cluster]`): each host's servers started by
fleetgen itself on the GPUs the fleet file lists (`deploy.instance`), read through the host's one session."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial

from fleetgen.config import FleetFile, HostEntry, Instance
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.instance import ensure_up, stop_instance
from fleetgen.deploy.placement.base import Offered, Placed
from fleetgen.deploy.session import HostSession
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.types import InstanceCommand, Outcome, Rollout, Say, WantedInstance, settle


class HostsPlacement:
    """`[[hosts]]`: fleetgen starts each server on its host (SSH, or this machine)."""

    kind = "hosts"
    label = "SSH hosts"
    can_tune = True
    is_per_instance = False
    launches_on_login = True

    async def launch_survey(self, fleet: Fleet, login: HostSession, say: Say) -> HostSurvey:
        return login.survey  # its servers launch where `login` stands (or on nodes that share its files)

    async def preflight(self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance]) -> None:
        """Nothing beyond the host's survey (`open_session` refused a host that cannot launch)."""

    async def up(
        self, fleet: Fleet, login: HostSession, wanted: Sequence[WantedInstance], run: Rollout
    ) -> list[Outcome]:
        return await settle(login.entry.name, wanted, partial(ensure_up, login, run))

    async def down(
        self,
        fleet: Fleet,
        login: HostSession,
        targets: Sequence[InstanceCommand],
        records: dict[str, InstanceRecord],
    ) -> list[Outcome]:
        return await settle(login.entry.name, targets, partial(stop_instance, login, records))

    async def place(
        self,
        fleet: Fleet,
        login: HostSession,
        instances: Sequence[Instance],
        records: dict[str, InstanceRecord],
        stack: contextlib.AsyncExitStack,
    ) -> list[Placed]:
        """Every instance on its host, through the host's session."""
        return [Placed(inst, login) for inst in instances]

    async def planning_gpus(self, fleet_file: FleetFile, entry: HostEntry) -> Offered | None:
        return None  # the host's own GPUs, as its survey read them


PLACEMENT = HostsPlacement()
