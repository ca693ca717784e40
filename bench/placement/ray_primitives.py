"""fleetgen's Ray placement alone, in a driver of its own: `remote.ray`'s connect, one placement group +
detached actor per server (`place_server`), each actor answering, then their removal (`remove_server`);
and what one command on a node costs as a Ray task (`RayHost.run`, sequential, after a warm-up), and one
survey of the node (`hostsurvey.survey_host`, as `up` and `down` read a node, ENGINE_JSON's `[engine]`).
Prints one JSON line of seconds; run by `run_placement.py`, which imports only `node_costs` (Ray is
imported on first use: it stays out of that process).

    python ray_primitives.py ADDRESS NUM_SERVERS ENGINE_JSON WORKDIR
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from fleetgen.config import EngineConfig, HostEntry
from fleetgen.deploy.hostsurvey import survey_host
from fleetgen.remote import ray
from fleetgen.remote.base import Host

NUM_COMMANDS = 10  # commands (and surveys) run on a node one after the other


async def node_costs(host: Host, engine: EngineConfig, workdir: str) -> dict[str, float]:
    """One command (`true`) and one survey on `host`, each the mean of NUM_COMMANDS after a warm-up."""
    entry = HostEntry.model_validate({"name": "bench", "ssh": "local", "workdir": workdir})
    await host.run(["true"])  # the first starts a Ray worker or opens the SSH channel: not each one's cost
    began = time.perf_counter()
    for _ in range(NUM_COMMANDS):
        await host.run(["true"])
    commanded = time.perf_counter()
    for _ in range(NUM_COMMANDS):
        await survey_host(host, entry, engine)
    surveyed = time.perf_counter()
    return {
        "node_command_s": (commanded - began) / NUM_COMMANDS,
        "node_survey_s": (surveyed - commanded) / NUM_COMMANDS,
    }


async def main(address: str, num: int, engine: EngineConfig, workdir: str) -> dict[str, float]:
    start = time.perf_counter()
    await ray.connect(address, "fleetgen-bench")
    connected = time.perf_counter()
    specs = [ray.ServerSpec(f"bench-{k}", "fleetgen-bench", 1, {}, {}, {}) for k in range(num)]
    await asyncio.gather(*(ray.place_server(s, 120.0) for s in specs))
    grouped = time.perf_counter()
    states = await asyncio.gather(*(ray.server_state(s.name, s.namespace) for s in specs))
    while not all(st.is_alive for st in states):  # each actor created and listed alive
        await asyncio.sleep(0.05)
        states = await asyncio.gather(*(ray.server_state(s.name, s.namespace) for s in specs))
    alive = time.perf_counter()
    await asyncio.gather(*(ray.remove_server(s.name, s.namespace) for s in specs))
    removed = time.perf_counter()
    [node, *_] = [n for n in await ray.nodes() if n.is_alive]
    costs = await node_costs(ray.RayHost("bench", node, is_here=True), engine, workdir)
    return {
        **costs,
        "connect_s": connected - start,
        "groups_placed_s": grouped - connected,
        "actors_alive_s": alive - grouped,
        "removed_s": removed - alive,
    }


if __name__ == "__main__":
    engine = EngineConfig.model_validate(json.loads(sys.argv[3]))
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2]), engine, sys.argv[4]))), flush=True)
