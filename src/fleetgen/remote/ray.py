"""A Ray cluster as fleetgen drives it (`[cluster] kind = "ray"`): the driver's connection, the cluster's
nodes, each server's placement group (STRICT_PACK: its `tp` GPUs on one node) held by a detached actor
(`raynode.ServerHolder`), and `RayHost`, a node reached by Ray tasks pinned to it (as `srun` reaches a
Slurm job's node), so the chain SSH hosts run (`/proc`, logs, verified puts) runs unchanged there.

Only Ray's public API (`ray.init`, `ray.nodes`, `ray.get_actor`, `ray.kill`, `ray.util.placement_group`,
`get_placement_group`, `placement_group_table`, `remove_placement_group`, `list_named_actors`, the
scheduling strategies): a KubeRay cluster works the same. Ray is imported on first use (`_ray`): a second of
import that a `[[hosts]]` fleet's commands never pay. Ray's errors become RemoteError / DeployError here, in
Ray's words; a `ray://` connection the head did not take (its per-connection server not started in time,
under load) is tried once more (`connect_twice`). The code that runs on the nodes (`raynode`) travels by
value: the nodes need no fleetgen.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetgen.errors import DeployError, RemoteError
from fleetgen.remote import raynode
from fleetgen.remote.base import Host, Output

_CALL_TIMEOUT_S = 60.0  # one call to the cluster (a lookup, a kill) that does not answer is an error
_CONNECTED: dict[str, tuple[str, str]] = {}  # the (address, namespace) this process is the driver of
_CONNECT_ERRORS = (ConnectionError, RuntimeError, ValueError)
# What Ray Client's proxy on the head answers when the connection's own server (`ray_client_server_<port>`,
# started per connection) exited before it ran, or did not answer in RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S
# (ray/util/client/server/proxier.py); the client's own words when the proxy did not answer in its retries
SERVER_NOT_STARTED = ("Starting Ray client server failed", "Proxy failed to Connect to backend")
CLIENT_TIMEOUT = "ray client connection timeout"
LOADED_HEAD_FIX = (
    "the head's Ray Client proxy could not start this connection's own server (ray_client_server_<port>.err "
    "in the head's session_latest/logs says why; under load it exits as it starts, or answers late): look at "
    "the head's load (`ray status`, its CPU) and connect again once it is lighter; where Ray said it waited "
    'for that server ("Proxy failed to Connect to backend"), give it longer: '
    "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S=180 in the head's environment before `ray start --head` "
    "(Ray's default: 30 s)"
)


@functools.cache
def _ray() -> Any:
    """Ray, imported once, on first use; its node-side code registered to travel by value."""
    try:  # imported by name, here only: Ray's second of import is paid by Ray fleets alone
        ray: Any = importlib.import_module("ray")
        for part in ("ray.cloudpickle", "ray.util.scheduling_strategies"):
            importlib.import_module(part)
    except ImportError as exc:
        raise RemoteError(
            f'a [cluster] kind = "ray" fleet needs Ray in fleetgen\'s Python: {exc}',
            fix="pip install 'fleetgen[ray]' (Ray 2.x, the cluster's own minor version is best)",
        ) from exc
    ray.cloudpickle.register_pickle_by_value(raynode)
    return ray


async def connect(address: str, namespace: str, say: Callable[[str], None] = lambda _line: None) -> None:
    """This process as the cluster's driver (`ray.init`), once per address and namespace. A `ray://`
    connection the head did not take in time (`is_retried`) is tried once more, said through `say`."""
    ray = _ray()
    if ray.is_initialized():
        if _CONNECTED.get("to") == (address, namespace):
            return
        await asyncio.to_thread(ray.shutdown)

    async def attempt() -> None:
        await asyncio.to_thread(
            ray.init, address=address, namespace=namespace, logging_level=logging.ERROR, log_to_driver=False
        )

    await connect_twice(attempt, address, say)
    _CONNECTED["to"] = (address, namespace)


async def connect_twice(
    attempt: Callable[[], Awaitable[None]], address: str, say: Callable[[str], None]
) -> None:
    """`attempt` (one `ray.init`), once more where the first failed as `is_retried` says is worth it."""
    try:
        return await attempt()
    except _CONNECT_ERRORS as exc:
        is_listening = CLIENT_TIMEOUT in str(exc) and await _is_listening(address)
        if not is_retried(address, exc, is_listening=is_listening):
            raise unreachable(address, exc) from exc
        say(f"the Ray cluster at {address} did not take the connection ({ray_said(exc)}); trying once more")
    try:
        return await attempt()
    except _CONNECT_ERRORS as exc:
        raise not_taken(address, exc) from exc


def is_retried(address: str, exc: BaseException, *, is_listening: bool) -> bool:
    """Whether a failed `ray.init` is worth one more try: a `ray://` connection whose head answered but did
    not start the connection's own server in time (a loaded head), or whose client timed out while something
    listens at the address. Never a GCS address (no per-connection server), nor one where nothing listens (a
    wrong address: a second try only doubles the wait), nor Ray's other refusals (a version mismatch)."""
    if not address.startswith("ray://"):
        return False
    text = str(exc)
    if any(words in text for words in SERVER_NOT_STARTED):
        return True
    return CLIENT_TIMEOUT in text and is_listening


async def _is_listening(address: str) -> bool:
    """Whether a `ray://host[:port]` address accepts a TCP connection (Ray Client's default port: 10001)."""
    where = address.removeprefix("ray://")
    host, has_port, port = where.rpartition(":")
    if not has_port:
        host, port = where, "10001"
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5.0)
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    return True


def ray_said(exc: BaseException) -> str:
    """Ray's own words in a failed connection: the last line (the proxy's answer comes as the head's
    traceback, its error on the last line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def unreachable(address: str, exc: BaseException) -> RemoteError:
    return RemoteError(
        f"cannot reach the Ray cluster at {address}: {ray_said(exc)}",
        fix="start it (`ray start --head`), or set cluster.address to its head: `ray://head:10001` "
        "(Ray Client) or the GCS `head:6379`; KubeRay: the head service's address",
    )


def not_taken(address: str, exc: BaseException) -> RemoteError:
    return RemoteError(
        f"the Ray cluster at {address} did not take the connection, twice: {ray_said(exc)}",
        fix=LOADED_HEAD_FIX,
    )


@dataclass(frozen=True)
class RayNode:
    """A node as Ray lists it (`ray.nodes()`)."""

    node_id: str
    address: str
    gpus: float
    labels: Mapping[str, str]
    is_alive: bool
    death: str = ""  # Ray's DeathReasonMessage for a dead node

    @property
    def label(self) -> str:
        return f"node {self.node_id[:8]} ({self.address})"

    def describe(self) -> str:
        """The node and its state as Ray listed it (alive, or dead and Ray's reason)."""
        state = "alive" if self.is_alive else f"dead: {self.death or 'no reason given'}"
        return f"node {self.node_id[:8]} ({self.address}, {state})"


async def nodes() -> list[RayNode]:
    """Every node the cluster lists, alive or dead."""
    listed = await asyncio.to_thread(_ray().nodes)
    return [
        RayNode(
            n["NodeID"],
            n["NodeManagerAddress"],
            float(n.get("Resources", {}).get("GPU", 0.0)),
            dict(n.get("Labels") or {}),
            bool(n["Alive"]),
            str(n.get("DeathReasonMessage") or ""),
        )
        for n in listed
    ]


def driver_address() -> str:
    """This machine's address as Ray sees it (a node there is reached at its loopback)."""
    return str(_ray().util.get_node_ip_address())


@dataclass(frozen=True)
class ServerSpec:
    """One server's placement: its actor's (and group's) name, GPUs, and what the fleet file asks."""

    name: str
    namespace: str
    gpus: int
    resources: Mapping[str, float]
    labels: Mapping[str, str]
    runtime_env: Mapping[str, Any]


@dataclass(frozen=True)
class ServerState:
    """Where a server's actor is now: alive on `node`, or gone (`why`, in Ray's words)."""

    name: str
    is_alive: bool
    node: RayNode | None
    why: str = ""


async def place_server(spec: ServerSpec, timeout_s: float) -> RayNode:
    """A placement group of one bundle (`gpus` GPUs + the resources asked, on one node: STRICT_PACK) and the
    detached actor holding it; the node it landed on. A group Ray cannot place in `timeout_s` is removed."""
    ray = _ray()
    bundle = {"GPU": float(spec.gpus), **spec.resources}
    selector = [dict(spec.labels)] if spec.labels else None
    group = ray.util.placement_group(
        [bundle], strategy="STRICT_PACK", name=spec.name, lifetime="detached", bundle_label_selector=selector
    )
    try:
        await asyncio.wait_for(group.ready(), timeout_s)
    except TimeoutError:
        state = (await asyncio.to_thread(ray.util.placement_group_table, group)).get("state", "?")
        await asyncio.to_thread(ray.util.remove_placement_group, group)
        raise DeployError(
            f"{spec.name}: Ray did not place a group of {bundle} (STRICT_PACK, labels {dict(spec.labels)}) "
            f"within {timeout_s:.0f} s: {state}; the group was removed",
            fix="free or add GPUs (`ray status` lists what is used), lower engine.tp, or raise "
            "cluster.pending_timeout_s",
        ) from None
    holder = ray.remote(raynode.ServerHolder).options(
        name=spec.name,
        namespace=spec.namespace,
        lifetime="detached",
        num_cpus=0,
        num_gpus=spec.gpus,
        resources=dict(spec.resources),
        max_restarts=0,
        runtime_env=dict(spec.runtime_env) or None,
        scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0
        ),
    )
    holder.remote(spec.name)
    table = await asyncio.to_thread(ray.util.placement_group_table, group)
    node_id = table["bundles_to_node_id"][0]
    return next(n for n in await nodes() if n.node_id == node_id)


async def launch(spec: ServerSpec, job_sh: str, script: str, log: str, pidfile: str, cwd: str) -> int:
    """The actor starts the launch in `cwd`; the PID of its child (the engine, once the job script
    `exec`s)."""
    actor = await _actor(spec.name, spec.namespace)
    if actor is None:
        raise DeployError(f"{spec.name}: its Ray actor is gone before it launched", fix="`fleetgen up` again")
    started = actor.launch.remote(job_sh, script, log, pidfile, cwd)
    return int(await asyncio.wait_for(started, _CALL_TIMEOUT_S))


async def _actor(name: str, namespace: str) -> Any:
    """The named actor's handle, None when Ray lists none alive by that name."""
    try:
        return await asyncio.to_thread(_ray().get_actor, name, namespace=namespace)
    except ValueError:
        return None


async def server_state(name: str, namespace: str, last_node: str = "") -> ServerState:
    """Whether the server's actor lives, and on which node; gone: why, in Ray's words (the node's death
    reason, the placement group's state). `last_node`: the node it was placed on (its group may be gone)."""
    ray = _ray()
    listed = {n.node_id: n for n in await nodes()}
    group = await _group(name)
    table = await asyncio.to_thread(ray.util.placement_group_table, group) if group is not None else {}
    node = listed.get(table.get("bundles_to_node_id", {}).get(0, "")) or listed.get(last_node)
    actor = await _actor(name, namespace)
    if actor is not None:
        try:
            await asyncio.wait_for(actor.child_exit.remote(), _CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as exc:
            return ServerState(name, False, node, f"Ray actor {name} died: {_first_line(exc)}")
        return ServerState(name, True, node)
    words = [f"Ray lists no actor {name} in namespace {namespace} (killed, or lost with its node)"]
    if group is None:
        words.append("and no placement group")
    else:
        words.append(f"placement group {table.get('state', '?')}")
    if (was := listed.get(last_node)) is not None and not was.is_alive:
        words.append(f"it ran on {was.describe()}")
    elif node is not None and not node.is_alive:
        words.append(node.describe())
    return ServerState(name, False, node, "; ".join(words))


async def _group(name: str) -> Any:
    try:
        return await asyncio.to_thread(_ray().util.get_placement_group, name)
    except ValueError:
        return None


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


async def remove_server(name: str, namespace: str) -> bool:
    """Kill the server's actor and remove its placement group, then wait until Ray lists neither; whether
    there was anything to remove."""
    ray = _ray()
    actor, group = await _actor(name, namespace), await _group(name)
    if actor is not None:
        await asyncio.to_thread(ray.kill, actor, no_restart=True)
    if group is not None:
        await asyncio.to_thread(ray.util.remove_placement_group, group)
    async for left in _listed(name, namespace):
        if left:
            raise DeployError(
                f"Ray still lists {left} {_CALL_TIMEOUT_S:.0f} s after removing it",
                fix="look at it: `ray list actors`, `ray list placement-groups` (a node may not answer)",
            )
    return actor is not None or group is not None


async def _listed(name: str, namespace: str) -> AsyncIterator[str]:
    """Poll until Ray lists neither the actor nor a live group by `name`; yields once more, non-empty, when
    the deadline passes with one still listed."""
    ray, deadline = _ray(), asyncio.get_running_loop().time() + _CALL_TIMEOUT_S
    while True:
        named = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        actors = [a for a in named if a["name"] == name and a["namespace"] == namespace]
        groups = await asyncio.to_thread(ray.util.placement_group_table)
        live = [g for g in groups.values() if g.get("name") == name and g.get("state") != "REMOVED"]
        left = ", ".join([*(f"actor {name}" for _ in actors), *(f"placement group {name}" for _ in live)])
        if not left:
            return
        if asyncio.get_running_loop().time() > deadline:
            yield left
            return
        await asyncio.sleep(0.2)


class RayHost(Host):
    """A Ray node, each command a Ray task pinned to it (NodeAffinitySchedulingStrategy, soft=False)."""

    def __init__(self, name: str, node: RayNode, *, is_here: bool) -> None:
        super().__init__(name)
        self.node = node
        self.is_here = is_here  # the node's address is this machine's: its loopback ports are reachable

    async def _exec(self, argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> Output:
        ray = _ray()
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            self.node.node_id, soft=False
        )
        task = ray.remote(raynode.run_command).options(
            num_cpus=0, scheduling_strategy=strategy, max_retries=0
        )
        try:
            done = await asyncio.wait_for(task.remote(list(argv), stdin, timeout_s), timeout_s + 30.0)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise RemoteError(
                f"{self.name}: Ray could not run a command on {self.node.label}: {_first_line(exc)}",
                fix="`ray status` shows the cluster's nodes; `fleetgen status` says which servers are placed",
                context={"host": self.name, "argv": " ".join(argv[:3])},
            ) from exc
        status, out, err = done
        return int(status), bytes(out), bytes(err)

    async def _stream_lines(self, argv: Sequence[str]) -> AsyncIterator[str]:
        raise RemoteError(
            f"following a file on {self.name} through Ray is not supported",
            fix="`fleetgen logs` without --follow reads its tail",
        )
        yield ""  # pragma: no cover (makes this an async generator)

    async def forward(self, remote_port: int) -> int:
        if self.is_here:
            return remote_port
        raise RemoteError(
            f"{self.name}: a server on {self.node.label}'s loopback cannot be reached through Ray",
            fix='bind the cluster network: engine.bind = "0.0.0.0" with engine.api_key_env (the key travels '
            "in 0600 files, never in Ray's runtime env)",
        )
