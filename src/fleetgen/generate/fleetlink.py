"""What a job takes from the fleet it runs on (`JobServers`): its endpoints, a description for the store,
and what it may ask of them (the instances not ready at the start, re-reading one from its host, the
`--restart-dead` restart).

The description goes to the store's meta (`fleet`, `engine_args`) so a report says what generated the data:
the engine section of the fleet file — kind, version, model, args, tp — and the instance names. Never the
values of `engine.env` (they may hold tokens); only their names. With `--endpoint` URLs, the URLs.

The `--restart-dead` hook runs `up`, then `restart` if the instance hung.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetgen.config import FleetFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import up
from fleetgen.deploy.readiness import Readiness
from fleetgen.deploy.types import Action, Outcome
from fleetgen.errors import DeployError
from fleetgen.fleet.pool import FleetLinks, Link
from fleetgen.generate.runner import JobServers
from fleetgen.http.urls import BareURLs


def fleet_meta(fleet_file: FleetFile, fleet_path: Path, instances: Sequence[str]) -> dict[str, Any]:
    """Meta entries for a run on a fleet file: `fleet` (engine section, no env values) and `engine_args`."""
    engine = fleet_file.engine
    return {
        "fleet": {
            "file": str(fleet_path.resolve()),
            "kind": engine.kind,
            "version": engine.version,
            "model": engine.model,
            "served_model_name": engine.served_model_name,
            "tp": engine.tp,
            "env_names": sorted(engine.env),
            "hosts": [host.name for host in fleet_file.hosts],
            "instances": sorted(instances),
        },
        "engine_args": dict(engine.args),
    }


def url_servers(servers: BareURLs) -> JobServers:
    """A job on bare `--endpoint` URLs (each named by its address): all that is known is where they are."""
    return JobServers(servers.named(), describe={"fleet": {"endpoints": list(servers.urls)}})


def fleet_servers(
    fleet: Fleet, links: FleetLinks, at_start: Sequence[Link], restart_dead: bool
) -> JobServers:
    """A job on the instances of `fleet` (`at_start`: as read then; those not ready start drained),
    `links.read_one` to re-read one, and with `restart_dead` a dead one brought back by `revive`."""
    return JobServers(
        [(e.name, e.url) for e in at_start],
        describe=fleet_meta(fleet.file, fleet.path, links.names),
        api_key=links.secret,
        engine_kind=fleet.file.engine.kind,
        not_ready={e.name: (e.readiness, e.problem) for e in at_start if e.readiness is not Readiness.READY},
        read_one=links.read_one,
        on_dead=functools.partial(revive, fleet) if restart_dead else None,
    )


async def revive(fleet: Fleet, instance: str) -> Outcome:
    """Bring a dead instance back through the deploy layer; raise when it does not come back verified.

    `up` first: it starts the instance only if its process is gone (or differs from the fleet file), so a
    server that is alive but briefly failing requests (overloaded, 503s) is verified and left running, not
    killed with its in-flight work. A process that runs but cannot be verified (hung) is then restarted.
    """
    outcome = _one(await up(fleet, only=[instance]), instance)
    if outcome.error is not None and outcome.action is Action.UNCHANGED:
        outcome = _one(await up(fleet, only=[instance], force=True), instance)
    if outcome.error is not None:
        raise DeployError(
            f"restarting {instance} failed: {outcome.error.message}",
            context={"instance": instance, **outcome.error.context},
            fix=outcome.error.fix
            or f"look at `fleetgen logs {instance}`; the job goes on with the other instances",
        )
    return outcome


def _one(outcomes: Sequence[Outcome], instance: str) -> Outcome:
    for outcome in outcomes:
        if outcome.instance == instance:
            return outcome
    raise DeployError(f"the deploy layer reported nothing for {instance}", fix="check `fleetgen status`")
