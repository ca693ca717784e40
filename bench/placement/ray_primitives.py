"""fleetgen's Ray placement alone, in a driver of its own: `remote.ray`'s connect, one placement group +
detached actor per server (`place_server`), each actor answering, then their removal (`remove_server`);
and what one command on a node costs as a Ray task (`RayHost.run`, sequential, after a warm-up).
Prints one JSON line of seconds; run by `run_placement.py` (never imported: Ray stays out of its process).

    python ray_primitives.py ADDRESS NUM_SERVERS
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from fleetgen.remote import ray

NUM_COMMANDS = 20  # `true` run on a node one after the other, as a Ray task each (`RayHost`)


async def main(address: str, num: int) -> dict[str, float]:
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
    host = ray.RayHost("bench", node, is_here=True)
    await host.run(["true"])  # the first task starts a worker: not what each command costs
    began = time.perf_counter()
    for _ in range(NUM_COMMANDS):
        await host.run(["true"])
    return {
        "node_command_s": (time.perf_counter() - began) / NUM_COMMANDS,
        "connect_s": connected - start,
        "groups_placed_s": grouped - connected,
        "actors_alive_s": alive - grouped,
        "removed_s": removed - alive,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))), flush=True)
