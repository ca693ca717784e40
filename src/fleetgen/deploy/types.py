"""The deploy layer's values: what an instance should run (`WantedInstance`, `InstanceCommand`), what one
`up` brings (`Rollout`), what `up`/`down` did (`Outcome`, `Action`), and `settle` (work on each instance in
parallel, each on its own Outcome). Read by every placement (`deploy.placement`) and the instance lifecycle
(`deploy.instance`)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from fleetgen.config import Instance
from fleetgen.deploy.script import Command
from fleetgen.deploy.state import InstanceRecord
from fleetgen.deploy.verify import Verified
from fleetgen.engines.base import Engine
from fleetgen.errors import FleetgenError
from fleetgen.plan import Launch

Narrate = Callable[[str, str], None]  # (instance, message)
Say = Callable[[str], None]  # a line for the user, of no one instance (a cluster connection tried again)


class Action(enum.StrEnum):
    UNCHANGED = "unchanged"  # the running process already matched: left alone
    STARTED = "started"  # nothing ran: a new process
    REPLACED = "replaced"  # a different (or forced) process was stopped and a new one started
    STOPPED = "stopped"
    ABSENT = "absent"  # down: nothing was running


@dataclass(frozen=True)
class InstanceCommand:
    """An instance and the command it runs, no script rendered: all `down` needs to find its process (pidfile,
    argv[0]), remove its key files and wait its port free (`wanted.wanted_command` builds the command)."""

    inst: Instance
    command: Command


class _OfInstance(Protocol):
    @property
    def inst(self) -> Instance: ...


_Item = TypeVar("_Item", bound=_OfInstance)


@dataclass(frozen=True)
class WantedInstance:
    """One instance as the fleet file wants it."""

    inst: Instance
    launch: Launch  # what decided argv + env: the engine version and rule set (recorded in the state)
    command: Command
    script: str
    sha256: str
    secret_value: str | None
    planned: Mapping[str, float]
    timeout_s: float

    def record(
        self, host: str, log_path: str, pid: int = 0, start_time: int = 0, *, placement_id: str = ""
    ) -> InstanceRecord:
        """The state file's record of launching this instance on `host` (placed by a cluster's job or actor:
        pid 0 until it runs)."""
        return InstanceRecord(
            instance=self.inst.name,
            host=host,
            gpus=self.inst.gpus,
            port=self.inst.port,
            pid=pid,
            start_time=start_time,
            log_path=log_path,
            script_path=self.command.paths.script,
            script_sha256=self.sha256,
            launched_at=datetime.now(UTC).isoformat(),
            argv=self.command.argv,
            env_names=tuple(sorted(self.command.environ)),
            engine_version=self.launch.version,
            rule_set=self.launch.rules.name,
            placement_id=placement_id,
        )


@dataclass
class Outcome:
    """What `up`/`down` did to one instance, and what it established."""

    instance: str
    host: str
    action: Action | None = None
    pid: int | None = None
    url: str = ""
    log_path: str = ""
    error: FleetgenError | None = None
    verified: Verified | None = None
    elapsed_s: float = 0.0
    record: InstanceRecord | None = field(default=None, repr=False)
    swept: list[int] = field(default_factory=list)  # what an ended job or actor left on its node, stopped


@dataclass(frozen=True)
class Rollout:
    """What one `up` brings to each instance: the engine, the earlier launches' records, whether to restart
    what already runs as wanted, and where progress lines and new launch records go."""

    engine: Engine
    records: Mapping[str, InstanceRecord]
    progress: Narrate
    on_record: Callable[[InstanceRecord], None]
    force: bool = False


async def settle(
    host: str, wanted: Sequence[_Item], work: Callable[[_Item, Outcome], Awaitable[None]]
) -> list[Outcome]:
    """`work` on each instance in parallel (a `WantedInstance` for `up`, an `InstanceCommand` for `down`),
    each on a new Outcome, timed: done when it returns, its error kept when it raises one of ours."""

    async def one(w: _Item) -> Outcome:
        out = Outcome(instance=w.inst.name, host=host)
        started = time.monotonic()
        try:
            await work(w, out)
        except FleetgenError as exc:
            out.error = exc
        out.elapsed_s = time.monotonic() - started
        return out

    return list(await asyncio.gather(*(one(w) for w in wanted)))
