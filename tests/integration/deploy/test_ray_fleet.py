"""A fleet placed by a REAL Ray cluster (tests/fixtures/ray.py: a head and a second node on this machine, GPUs
declared): `up` → `status` → `run` (exactly once while one server's actor is killed and the second node is
stopped, `--restart-dead` placing the killed one again) → `down` with nothing left, in Ray's listing or on
the nodes; and a real vLLM-CPU server (the tiny model) up → verify → run → down through Ray.

The sim servers are `fleetgen.sim` processes (SGLang cannot start without a GPU); everything else is real:
the placement groups, the detached actors, Ray's scheduling of the declared GPUs, the tasks pinned to a node.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

from fleetgen.remote.raynode import MARK
from tests.fixtures import skip_or_fail
from tests.fixtures.fleetcli import (
    RUN_FLAGS,
    SIM_SPEC_ARGS,
    assert_every_record_once,
    cli,
    finish,
    fleetgen,
    query,
    text_appears,
    wait_for_rows,
    write_prompts,
)
from tests.fixtures.ports import free_ports
from tests.fixtures.ray import LocalRay, python_by_node
from tests.fixtures.vllm import TinyModel
from tests.integration.deploy.support import toml_value
from tests.integration.deploy.test_slurm_fleet import our_processes, state, statuses
from tests.integration.deploy.test_vllm import NGRAM

pytestmark = [pytest.mark.ray]

MODEL = Path(__file__).parents[2] / "data" / "models" / "qwen3.6-27b"  # its config.json: what plan sizes

NUM_SERVERS = 4  # two on each node (2 declared GPUs each)
SIM_ARGS = {**SIM_SPEC_ARGS, "sim-decode-tps": 10.0}  # slow enough that a server lost has requests in flight
# Ray's own listing, read by a driver of its own (the test's process stays no Ray driver)
LISTED = """import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
groups = [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
second = [n["NodeID"] for n in ray.nodes() if "second_node" in n["Resources"]]
print(json.dumps({"actors": actors, "groups": groups, "second": second}))
"""
KILL = """import sys, ray
ray.init(address=sys.argv[1], namespace="fleetgen", logging_level="ERROR", log_to_driver=False)
ray.kill(ray.get_actor(sys.argv[2]))
"""


def write_ray_fleet(
    tmp_path: Path,
    ray_cluster: LocalRay,
    engine: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    cluster: Mapping[str, object] | None = None,
) -> Path:
    """A fleet file of NUM_SERVERS sim servers placed by the test's Ray cluster; as `write_cluster_fleet`."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    sim = {
        "kind": "sglang",
        "python": sys.executable,
        "model": str(model),
        "launcher": ["-m", "fleetgen.sim"],
    }
    eng = dict(engine or {**sim, "ready_timeout_s": 120.0, "args": SIM_ARGS})
    args = eng.pop("args", {})
    assert isinstance(args, Mapping)
    values: dict[str, object] = {
        "kind": "ray",
        "address": ray_cluster.address,
        "gpus": NUM_SERVERS,
        "workdir": str(tmp_path / "work"),
        "base_port": free_ports(1)[0],
        "gpu_memory_gib": 80.0,
        "pending_timeout_s": 20.0,
        **(cluster or {}),
    }
    lines = [
        "[engine]",
        *(f"{k} = {toml_value(v)}" for k, v in eng.items()),  # type: ignore[arg-type]
        "",
        "[engine.args]",
        *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in args.items()),
        "",
        "[engine.env]",
        *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in (env or {}).items()),
        "",
        "[cluster]",
        *(f"{k} = {toml_value(v)}" for k, v in values.items()),  # type: ignore[arg-type]
    ]
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def listed(ray_cluster: LocalRay) -> dict[str, list[str]]:
    """What Ray lists: named actors, live placement groups, the second node's id (alive or not)."""
    out = subprocess.run(
        [sys.executable, "-c", LISTED, ray_cluster.address], capture_output=True, text=True, check=True
    )
    found: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def marked(actors: Collection[str]) -> list[int]:
    """PIDs of live processes on this machine (both nodes) that carry one of `actors`' mark."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if any(f"{MARK}={name}".encode() in environ for name in actors):
            found.append(int(proc.name))
    return found


def kill_actor(ray_cluster: LocalRay, name: str) -> None:
    subprocess.run([sys.executable, "-c", KILL, ray_cluster.address, name], check=True, capture_output=True)


async def test_plan_online_asks_the_ray_cluster_for_its_gpu_nodes(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    """`plan` (online) counts the GPUs of the cluster's live nodes: a fleet asking for more than the 4 this
    cluster declares is warned with the fix, one that fits is not (before the node-loss test stops one);
    the same through Ray Client (`address = "ray://head:port"`) as joined directly."""
    model = tmp_path / "model"
    model.mkdir()
    engine = {"kind": "sglang", "python": sys.executable, "model": str(model), "model_config": str(MODEL)}
    for how, address in (("joined", ray_cluster.address), ("client", ray_cluster.client_address)):
        warned = {}
        for gpus in (4, 6):
            folder = tmp_path / f"{how}{gpus}"
            folder.mkdir()
            cluster = {"gpus": gpus, "address": address}
            fleet = write_ray_fleet(folder, ray_cluster, engine=engine, cluster=cluster)
            code, out, err = await cli("plan", "--json", "-f", str(fleet))
            # 2: an instance does not fit; the plan is printed all the same
            assert code in (0, 2), out + err + ray_cluster.client_server_logs()
            warned[gpus] = [w for w in json.loads(out)["warnings"] if w["rule"] == "cluster-gpus"]
        assert warned[4] == [], how
        [over] = warned[6]
        assert "the Ray cluster's live nodes have 4 GPU(s)" in over["message"] and "at most 4" in over["fix"]


async def test_plan_online_plans_with_the_release_the_nodes_run_not_the_drivers(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    """`plan` online takes the engine release from the nodes a server may be placed on (a Ray task each, as
    `up` does), never the driver's: here the driver has 0.5.7 and the nodes 0.5.23 and 0.5.22, so the plan
    says the nodes differ and plans with 0.5.23, and the driver's release is in none of its notes."""
    releases = {"driver": "0.5.7", "head": "0.5.23", "second": "0.5.22"}
    python = python_by_node(tmp_path / "py", "sglang", releases)
    (tmp_path / "model").mkdir()
    engine = {"kind": "sglang", "python": str(python), "model": str(tmp_path / "model")}
    fleet = write_ray_fleet(tmp_path, ray_cluster, engine={**engine, "model_config": str(MODEL)})
    code, out, err = await cli("plan", "--json", "-f", str(fleet))
    assert code in (0, 2), out + err + ray_cluster.client_server_logs()
    said = [w["message"] for w in json.loads(out)["warnings"] if w["rule"] == "engine-version"]
    assert any("0.5.22, 0.5.23; planning with 0.5.23" in m for m in said), said
    assert not any("0.5.7" in m for m in said), said


async def test_down_surveys_each_node_once_however_many_servers_it_has(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    """`down` of 4 servers on 2 nodes reads each node (its survey: a Ray task starting the engine's python)
    once, as `status` does, not once per server and again for the sweep after each server's stop. Every
    start of the engine's python is counted (a `.pth` line of its venv)."""
    python = python_by_node(tmp_path / "py", "sglang", {"head": "0.5.23", "second": "0.5.23"})
    starts = tmp_path / "starts.log"
    site = next((tmp_path / "py" / "lib").glob("python*/site-packages"))
    (site / "fgcount.pth").write_text(f"import os; open({str(starts)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    engine: dict[str, object] = {"kind": "sglang", "python": str(python), "model": str(tmp_path / "model")}
    engine |= {"launcher": ["-m", "fleetgen.sim"], "args": SIM_ARGS, "ready_timeout_s": 120.0}
    fleet = write_ray_fleet(tmp_path, ray_cluster, engine=engine)
    code, out, err = await cli("up", "-f", str(fleet))
    try:
        assert code == 0, out + err
        counted = {}
        for command in ("status", "down"):
            before = len(starts.read_text().splitlines())
            code, out, err = await cli(command, "-f", str(fleet))
            assert code == 0, out + err
            counted[command] = len(starts.read_text().splitlines()) - before
    finally:
        await cli("down", "-f", str(fleet))
    assert counted["status"] > 0 and counted["down"] == counted["status"], counted
    assert listed(ray_cluster)["actors"] == []


async def test_up_through_a_ray_client_address_that_never_answers_tries_twice_and_says_so(
    tmp_path: Path,
) -> None:
    """Something listens at the `ray://` address but no Ray Client answers there (all a client can tell of a
    head too loaded to): Ray Client's own timeout (its three tries, about 30 s), then fleetgen's one more
    try, said on `up`'s progress lines, then the error in Ray's words with the fix for a loaded head. Real
    Ray client code against a real socket; no cluster needed."""
    if importlib.util.find_spec("ray") is None:
        skip_or_fail("Ray", "install fleetgen's `ray` extra (requirements.lock has it)")
    server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)  # accepts, never answers
    address = f"ray://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        fleet = write_ray_fleet(tmp_path, LocalRay(tmp_path), cluster={"address": address})
        code, out, err = await cli("up", "-f", str(fleet))
    said = out + err
    assert code != 0, said
    tried = [line for line in said.splitlines() if "trying once more" in line]
    assert len(tried) == 1 and address in tried[0] and "ray client connection timeout" in tried[0], said
    assert "did not take the connection, twice: ray client connection timeout" in said, said
    assert "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S" in said and "`ray status`" in said, said


@pytest.mark.parametrize("missing", ["python", "model"])
async def test_up_refuses_an_engine_the_nodes_cannot_start_before_placing_anything(
    missing: str, ray_cluster: LocalRay, tmp_path: Path
) -> None:
    """The engine's python and model folder are checked on the nodes a server may be placed on (a Ray task
    on each: the driver machine is no node), and a refusal names the node, the path and the fix."""
    path = str(tmp_path / "nowhere" / ("bin/python" if missing == "python" else "model"))
    engine = {
        "kind": "sglang",
        "python": sys.executable,
        "model": str(tmp_path / "model"),
        "launcher": ["-m", "fleetgen.sim"],
        "args": SIM_ARGS,
        missing: path,
    }
    fleet = write_ray_fleet(tmp_path, ray_cluster, engine=engine)
    code, out, err = await cli("up", "-f", str(fleet))
    said = out + err
    assert code != 0, said
    node = re.search(
        r"Ray node ([0-9a-f]{8}) \([^)]*\): the (engine's python|model folder) '?" + re.escape(path), said
    )
    assert node is not None, said
    assert "engine.python" in said if missing == "python" else "engine.model" in said, said  # the fix
    left = listed(ray_cluster)
    assert left["actors"] == [] and left["groups"] == [], left  # refused before anything was placed
    assert not (fleet.parent / ".fleetgen" / "state.json").exists() or state(fleet) == {}


async def test_up_refuses_a_node_of_another_engine_release_by_name_before_placing_anything(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    """A server's flags are decided before Ray picks its node, by the release the nodes run (never the
    driver's: it has another here): the second node runs an older one, so `up` refuses it by id and IP, in
    `hosts check`'s words and with the fix, before any actor starts."""
    releases = {"driver": "0.5.7", "head": "0.5.23", "second": "0.5.22"}
    python = python_by_node(tmp_path / "py", "sglang", releases)
    engine: dict[str, object] = {"kind": "sglang", "python": str(python), "model": str(tmp_path / "model")}
    engine |= {"launcher": ["-m", "fleetgen.sim"], "args": SIM_ARGS}
    fleet = write_ray_fleet(tmp_path, ray_cluster, engine=engine)
    code, out, err = await cli("up", "-f", str(fleet))
    if code == 0:  # placed (the refusal is missing): leave nothing for the tests after this one
        await cli("down", "-f", str(fleet))
    said = out + err
    assert code != 0, said
    [second] = listed(ray_cluster)["second"]
    named = set(
        re.findall(r"Ray node ([0-9a-f]{8}) \([^)]+\) has sglang 0\.5\.22, the plan expects 0\.5\.23", said)
    )
    assert named == {second[:8]}, said  # that node, and no other
    assert "install sglang==0.5.23 there" in said and "cluster.labels" in said, said  # the fix
    left = listed(ray_cluster)
    assert left["actors"] == [] and left["groups"] == [], left  # refused before anything was placed
    assert not (fleet.parent / ".fleetgen" / "state.json").exists() or state(fleet) == {}


async def test_a_ray_fleet_serves_a_job_exactly_once_through_a_killed_actor_and_a_lost_node(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    # the engine's release as the nodes run it and the driver does not: each server's flags decided by it
    python = python_by_node(
        tmp_path / "py", "sglang", {"driver": "0.5.7", "head": "0.5.23", "second": "0.5.23"}
    )
    engine: dict[str, object] = {"kind": "sglang", "python": str(python), "model": str(tmp_path / "model")}
    engine |= {"launcher": ["-m", "fleetgen.sim"], "ready_timeout_s": 120.0, "args": SIM_ARGS}
    fleet = write_ray_fleet(tmp_path, ray_cluster, engine=engine)
    names = {f"ray-{k}" for k in range(NUM_SERVERS)}
    actors: dict[str, str] = {}
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert f"{NUM_SERVERS}/{NUM_SERVERS} ready" in out and "verified" in out
        records = state(fleet)
        assert {str(rec["engine_version"]) for rec in records.values()} == {"0.5.23"}, records  # the nodes'
        actors = {name: str(rec["placement_id"]) for name, rec in records.items()}
        assert set(actors) == names and set(actors.values()) <= set(listed(ray_cluster)["actors"])
        node_of = {name: str(rec["node"]) for name, rec in records.items()}
        assert len(set(node_of.values())) == 2  # STRICT_PACK groups of 1 GPU: 2 per node of 2 GPUs
        for name, st in (await statuses(fleet)).items():
            assert st["ready"] is True and st["drift"] == [], st
            assert str(st["placement"]).startswith(f"Ray actor {actors[name]} on node {node_of[name][:8]}")

        prompts, result, log = (
            write_prompts(tmp_path / "p.jsonl", 600),
            tmp_path / "out",
            tmp_path / "run.log",
        )
        victim = "ray-1"
        second = listed(ray_cluster)["second"]
        assert len(second) == 1
        lost = sorted(n for n in names if node_of[n] == second[0])  # the servers on the second node
        run = ["run", str(prompts), "-o", str(result), "-f", str(fleet), "--restart-dead", *RUN_FLAGS]
        with log.open("wb") as err_file:
            async with fleetgen(*run, stderr=err_file) as proc:
                await asyncio.wait_for(wait_for_rows(result, 40, proc), 120)
                killed_at = time.time()
                kill_actor(ray_cluster, actors[victim])
                await asyncio.wait_for(text_appears(log, f"{victim} is ready again", proc), 120)
                await asyncio.wait_for(wait_for_rows(result, 300, proc), 240)
                ray_cluster.stop_node(1)  # the second node gone, as a VM is lost: `lost` with it
                stdout, _ = await finish(proc, limit_s=600)
        assert proc.returncode == 0, log.read_text()[-3000:]
        said = log.read_text()
        assert f"{victim} is down" in said and f"{victim} is ready again" in said, said
        # the killed actor in Ray's words (as `status` says them) before the restart, not only the transport's
        actor = re.escape(actors[victim])
        killed = rf"^{victim} is down: .*(Ray lists no actor {actor} .*\(killed|Ray actor {actor} died: )"
        assert re.search(killed, said, re.MULTILINE), said
        for name in lost:  # their node gone: said in Ray's words (its tasks refused, the GPUs left)
            assert re.search(rf"^{name} is down: .*Ray", said, re.MULTILINE), said
        assert_every_record_once(result, stdout, 600)  # 0 lost, 0 duplicated
        after = f"SELECT COUNT(*) FROM results WHERE instance = '{victim}' AND started_at > {killed_at}"
        assert query(result, after)[0][0] > 0  # placed again by --restart-dead and used by the same job
        shown = await statuses(fleet)
        for name in lost:  # in Ray's words: the actor gone, and why its node is (Ray's DeathReasonMessage)
            problem = str(shown[name]["problem"])
            assert shown[name]["ready"] is False and f"Ray lists no actor {actors[name]}" in problem, problem
            assert f"it ran on node {second[0][:8]}" in problem and "dead: " in problem, problem
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    left = listed(ray_cluster)
    assert left["actors"] == [] and left["groups"] == []  # Ray lists none of ours
    assert our_processes(tmp_path / "work") == []  # and nothing of the engines is left on the nodes
    assert marked(actors.values()) == []


@pytest.mark.vllm
@pytest.mark.slow
async def test_a_real_vllm_cpu_server_placed_by_ray_is_verified_serves_and_leaves_nothing(
    ray_cluster: LocalRay, vllm_python: Path, tiny_model: TinyModel, tmp_path: Path
) -> None:
    """One REAL vLLM-CPU server (the tiny model) placed by Ray: the SSH hosts' verification chain on its
    node (argv + env from /proc, readiness from the log, ngram speculation proven on, planned vs actual),
    a few records, then `down` with nothing left in Ray's listing or on the node."""
    args = {"enforce-eager": True, "dtype": "bfloat16", "max-model-len": 1024, "speculative-config": NGRAM}
    engine: dict[str, object] = {"kind": "vllm", "python": str(vllm_python), "model": str(tiny_model.path)}
    engine |= {"served_model_name": "tiny", "ready_timeout_s": 600.0, "args": args}
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env |= {"VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "PYTHONUNBUFFERED": "1"}
    env |= {"HF_HOME": str(tmp_path / "hf")}
    fleet = write_ray_fleet(tmp_path, ray_cluster, engine=engine, env=env, cluster={"gpus": 1})
    actor = ""
    try:
        code, out, err = await cli("up", "-f", str(fleet))
        assert code == 0, out + err
        assert "1/1 ready" in out and "verified" in out
        actor = str(state(fleet)["ray-0"]["placement_id"])
        assert actor in listed(ray_cluster)["actors"]
        [shown] = (await statuses(fleet)).values()
        assert shown["ready"] is True and shown["drift"] == [], shown
        assert str(shown["placement"]).startswith(f"Ray actor {actor} on node ")

        prompts, result = write_prompts(tmp_path / "p.jsonl", 8), tmp_path / "out"
        code, out, err = await cli("run", str(prompts), "-o", str(result), "-f", str(fleet), *RUN_FLAGS)
        assert code == 0, out + err
        summary = json.loads(out)
        assert summary["status"] == "complete" and summary["results"] == 8 and summary["errors"] == 0
    finally:
        code, out, err = await cli("down", "-f", str(fleet))
    assert code == 0, out + err
    left = listed(ray_cluster)
    assert left["actors"] == [] and left["groups"] == []
    assert our_processes(tmp_path / "work") == [] and marked([actor]) == []  # vLLM's EngineCore too
