"""Deploying the SGLang path over REAL sshd hosts, with `fleetgen.sim` as the engine.

SGLang cannot start without a GPU, so the engine behind `engine.launcher = ["-m", "fleetgen.sim"]` is the
simulated server (it speaks SGLang's HTTP surface and log lines); everything else — SSH, the launch script,
/proc, tunnels, the log watcher — is real.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest

from fleetgen.config import load_fleet
from fleetgen.deploy import wanted
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.deploy.readiness import Readiness
from fleetgen.deploy.types import Action, Outcome
from fleetgen.errors import LaunchFailed, VerifyError
from fleetgen.fleet.status import fleet_status
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.remote import open_host
from tests.fixtures import until
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.support import ArgValue, log_files, write_fleet

SPEC: dict[str, ArgValue] = {
    "speculative-algorithm": "EAGLE",
    "speculative-num-steps": 3,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 4,
    "mamba-radix-cache-strategy": "extra_buffer",
    "mem-fraction-static": 0.8,
    "max-running-requests": 8,
    "reasoning-parser": "qwen3",
}
FLEETGEN = str(Path(sys.executable).with_name("fleetgen"))
# A real model's config.json (no weights): the sim sizes its pools from it, the plan too.
QWEN36 = Path(__file__).resolve().parents[2] / "data" / "models" / "qwen3.6-27b"


def sim_fleet(
    tmp_path: Path,
    hosts: list[SshdHost],
    *,
    gpus: tuple[int, ...] = (0,),
    args: Mapping[str, ArgValue] | None = None,
    python: str = sys.executable,
    model: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    return write_fleet(
        tmp_path / "fleet.toml",
        hosts,
        kind="sglang",
        python=python,
        model=str(model or model_dir),
        workdir_tag=tmp_path.name,
        gpus=gpus,
        launcher=["-m", "fleetgen.sim"],
        ready_timeout_s=300.0,
        args={**SPEC, **(args or {})},
        env={"SIM_MARK": "a", **(env or {})},
    )


def _logged(log: Path, text: str) -> bool:
    return text in _read(log)


def _read(path: Path) -> str:
    """A file on a test host (they are this machine)."""
    return path.read_text()


def _ok(outs: list[Outcome]) -> None:
    for out in outs:
        assert out.error is None, f"{out.instance}: {out.error}"


async def test_two_hosts_two_instances_come_up_in_parallel_verified(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:2], gpus=(0, 1), args={"sim-start-delay": 5.0}, model=QWEN36)
    events: list[tuple[str, str]] = []
    try:
        outs = await up(Fleet.load(fleet), progress=lambda inst, msg: events.append((inst, msg)))
        _ok(outs)
        assert sorted(o.instance for o in outs) == ["h0-0", "h0-1", "h1-0", "h1-1"]
        assert all(o.action is Action.STARTED and o.error is None for o in outs)
        assert len({o.pid for o in outs}) == 4
        # Parallel: every instance was spawned before the first one was found healthy.
        kinds = [
            ("spawned" if m.startswith("spawned") else "healthy")
            for _, m in events
            if m.startswith(("spawned", "healthy"))
        ]
        assert kinds[:4] == ["spawned"] * 4 and kinds.count("healthy") == 4
        for out in outs:
            # speculation proven by the verify-call counter moving (the accept length comes later, as on
            # real SGLang)
            assert out.verified is not None and out.verified.spec_steps and out.verified.spec_steps > 0
            rows = {r.what: r for r in out.verified.capacity}
            assert rows["kv_tokens"].actual and rows["max_running_requests"].actual
            assert rows["kv_tokens"].planned and rows["max_running_requests"].planned
        script = _read(ssh_hosts[0].workdir / tmp_path.name / "h0-1" / "launch.sh")
        assert "export CUDA_VISIBLE_DEVICES=1" in script and "exec " in script

        # SGLang reports an accept length (the gauge, /server_info) only once a "Decode batch" line logged the
        # verify request's period, up to a second after it: status is read after that, not in the race.
        for out, host in zip(sorted(outs, key=lambda o: o.instance), [0, 0, 1, 1], strict=True):
            log = ssh_hosts[host].workdir / tmp_path.name / out.instance / "logs" / "current.log"
            await until(functools.partial(_logged, log, "accept len:"), timeout_s=30)
        done = await asyncio.to_thread(
            subprocess.run,
            [FLEETGEN, "status", "--json", "-f", str(fleet)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        assert {r["instance"] for r in rows} == {"h0-0", "h0-1", "h1-0", "h1-1"}
        for row in rows:
            assert row["ready"] is True and row["drift"] == [] and row["url"].startswith("http://127.0.0.1:")
            assert row["spec_accept_length"] and row["running"] == 0 and row["queued"] == 0
            assert row["uptime_s"] >= 0 and row["gen_tokens_per_s"] is not None

        logs = await asyncio.to_thread(
            subprocess.run,
            [FLEETGEN, "logs", "h1-1", "-n", "200", "--fleet", str(fleet)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert logs.returncode == 0, logs.stderr
        assert "The server is fired up and ready to roll!" in logs.stdout and "SIMULATION" in logs.stdout
    finally:
        stopped = await down(Fleet.load(fleet))
    _ok(stopped)
    assert {o.action for o in stopped} == {Action.STOPPED}


async def test_down_finds_and_stops_the_process_without_rendering_a_script(
    ssh_hosts: list[SshdHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`down` needs an instance's command (pidfile, argv[0], key files, port), never its launch script: with
    the renderer refusing, it still stops what `up` started."""
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])
    try:
        [started] = await up(Fleet.load(fleet))
        _ok([started])
    finally:

        def refuse(command: object) -> str:
            raise AssertionError("down rendered a launch script")

        monkeypatch.setattr(wanted, "render_script", refuse)
        stopped = await down(Fleet.load(fleet))
    _ok(stopped)
    assert [o.action for o in stopped] == [Action.STOPPED]
    assert started.pid is not None and stopped[0].pid == started.pid and _is_gone(started.pid)


async def test_oom_line_names_the_cause_and_stops_the_process(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], args={"sim-fail-at-start": "oom"})
    [out] = await up(Fleet.load(fleet))
    assert isinstance(out.error, LaunchFailed)
    assert "memory" in out.error.message.lower()
    assert "Not enough memory" in str(out.error.context["matched"])
    assert "mem-fraction-static" in out.error.fix
    assert "Not enough memory" in str(out.error.context["log tail"])
    assert out.pid is not None and _is_gone(out.pid)


def _is_gone(pid: int) -> bool:
    """Gone or a zombie (the test hosts are this machine: read /proc directly)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    except OSError:
        return True


async def test_spec_configured_but_not_running_is_refused(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], args={"sim-no-spec": True})
    try:
        [out] = await up(Fleet.load(fleet))
        assert isinstance(out.error, VerifyError)
        assert "speculative_algorithm" in str(out.error.context["mismatches"])
    finally:
        await down(Fleet.load(fleet))


async def test_tampered_env_shows_as_drift_then_up_replaces_it(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])
    host = ssh_hosts[0]
    root = host.workdir / tmp_path.name / "h0-0"
    try:
        [first] = await up(Fleet.load(fleet))
        _ok([first])
        # Someone restarts the server by hand with an edited environment.
        entry = load_fleet(fleet).host("h0")
        async with open_host(entry) as remote:
            assert first.pid is not None
            await remote.stop(first.pid)
            text = _read(root / "launch.sh").replace("SIM_MARK=a", "SIM_MARK=tampered")
            await remote.put(str(root / "hand.sh"), text.encode(), mode=0o755)
            hand = await remote.spawn(
                str(root / "hand.sh"), str(root / "logs" / "hand.log"), str(root / "pid"), cwd=str(root)
            )
        [st] = await fleet_status(Fleet.load(fleet), rate_window_s=0)
        assert st.pid == hand.pid and st.readiness is not Readiness.READY
        assert st.drift == ["env SIM_MARK: rendered 'a', running 'tampered'"]
        [healed] = await up(Fleet.load(fleet))
        _ok([healed])
        assert healed.action is Action.REPLACED and healed.pid != hand.pid
        [st2] = await fleet_status(Fleet.load(fleet), rate_window_s=0)
        assert st2.readiness is Readiness.READY and st2.drift == []
    finally:
        await down(Fleet.load(fleet))


async def test_wrong_python_is_named_before_anything_starts(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], python="/nonexistent/venv/bin/python")
    [out] = await up(Fleet.load(fleet))
    assert isinstance(out.error, LaunchFailed)
    assert "/nonexistent/venv/bin/python" in out.error.message and "engine.python" in out.error.fix
    assert out.pid is None


async def test_missing_model_folder_is_named(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], model=tmp_path / "no-such-model")
    [out] = await up(Fleet.load(fleet))
    assert isinstance(out.error, LaunchFailed)
    assert "model folder" in out.error.message and "no-such-model" in out.error.message
    assert "engine.model" in out.error.fix


async def test_port_in_use_is_named(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])
    port = load_fleet(fleet).instances()[0].port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        [out] = await up(Fleet.load(fleet))
    assert isinstance(out.error, LaunchFailed)
    assert f"port {port}" in out.error.message and "in use" in out.error.message
    assert "base_port" in out.error.fix and out.pid is None


async def test_process_dying_during_start_is_reported_with_its_log(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], args={"sim-start-delay": 60.0})

    def kill_on_spawn(_inst: str, message: str) -> None:
        if message.startswith("spawned pid"):
            os.kill(int(message.split()[2].rstrip(",")), signal.SIGKILL)  # the host is this machine

    [out] = await up(Fleet.load(fleet), progress=kill_on_spawn)
    assert isinstance(out.error, LaunchFailed)
    assert "exited while starting" in out.error.message
    assert out.error.context["log"] == out.log_path and out.error.fix
    assert len(log_files(ssh_hosts[0].workdir / tmp_path.name, "h0-0")) == 1


@pytest.mark.parametrize("only", [["h1"], ["h1-0"]])
async def test_only_touches_the_named_instances(
    ssh_hosts: list[SshdHost], tmp_path: Path, only: list[str]
) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:2])
    try:
        outs = await up(Fleet.load(fleet), only=only)
        _ok(outs)
        assert [o.instance for o in outs] == ["h1-0"]
        statuses = {s.instance: s for s in await fleet_status(Fleet.load(fleet), rate_window_s=0)}
        assert statuses["h1-0"].readiness is Readiness.READY and statuses["h0-0"].readiness is Readiness.DOWN
        assert statuses["h0-0"].problem == "not running"
    finally:
        await down(Fleet.load(fleet))


@pytest.mark.parametrize(
    ("bind", "reached_at"), [("127.0.0.2", "127.0.0.2"), ("0.0.0.0", "127.0.0.1"), ("::", "[::1]")]
)
async def test_public_bind_uses_the_key_and_never_writes_it(
    ssh_hosts: list[SshdHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bind: str, reached_at: str
) -> None:
    """A public bind with an API key on a `local` host (a specific loopback address is reachable there; on
    an SSH host it is refused, see test_netns_fleet; a wildcard bind is reached at the host's own loopback,
    not at "local"): reached directly, healthy, the key only in a 0600 file."""
    key = "sk-test-" + os.urandom(8).hex()
    monkeypatch.setenv("FLEETGEN_TEST_KEY", key)
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])
    fleet.write_text(fleet.read_text().replace(f'ssh = "{ssh_hosts[0].ssh}"', 'ssh = "local"', 1))
    assert 'ssh = "local"' in fleet.read_text()
    _append_engine(fleet, f'bind = "{bind}"\napi_key_env = "FLEETGEN_TEST_KEY"\n')
    root = ssh_hosts[0].workdir / tmp_path.name / "h0-0"
    try:
        [out] = await up(Fleet.load(fleet))
        _ok([out])
        assert out.url.startswith(f"http://{reached_at}:")
        async with aiohttp.ClientSession() as http:
            async with http.get(out.url + "/v1/models") as anonymous:
                assert anonymous.status == 401
            async with http.get(out.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as ok:
                assert ok.status == 200
        assert key not in _read(root / "launch.sh") and _mode(root / "launch.sh") == 0o700
        assert key not in _read(tmp_path / ".fleetgen" / "state.json")
        assert not (root / "api_key").exists() and not (root / "api_key.yaml").exists()  # read, then removed
        log = _read(Path(out.log_path))
        assert "api_key='<redacted>'" in log and key not in log and _mode(Path(out.log_path)) == 0o600
        [st] = await fleet_status(Fleet.load(fleet), rate_window_s=0)
        assert st.readiness is Readiness.READY and st.drift == [] and key not in json.dumps(st.to_json())
    finally:
        await down(Fleet.load(fleet))


def _append_engine(fleet: Path, lines: str) -> None:
    text = fleet.read_text()
    fleet.write_text(text.replace("[engine.args]", lines + "\n[engine.args]", 1))


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def test_cli_up_exits_non_zero_with_cause_and_fix(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], model=tmp_path / "missing-model")
    done = await asyncio.to_thread(
        subprocess.run, [FLEETGEN, "up", "-f", str(fleet)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "h0-0" in done.stderr and "missing-model" in done.stderr and "fix:" in done.stderr


def repeated_clauses(line: str) -> list[str]:
    """The clauses (split at ": " and "; ") a line says twice, e.g. a wrapped error's own message again."""
    clauses = [c.strip() for c in re.split(r"[:;] ", line) if len(c.strip()) >= 12]
    return sorted({c for c in clauses if clauses.count(c) > 1})


async def test_up_says_each_warning_once_in_one_line(ssh_hosts: list[SshdHost], tmp_path: Path) -> None:
    """Issue 29 item 6: a host without the model's config.json made `up` print "cannot read …/config.json on
    h0: cannot read …/config.json on h0: …" and "fix: …; fix: …" over several lines. Whatever up prints: no
    line says a clause twice or holds two fixes, and the warning is one line naming the file and one fix."""
    fleet = sim_fleet(tmp_path, ssh_hosts[:1])  # its model folder is empty
    with socket.socket() as squatter:  # and its port taken: up stops before launching
        squatter.bind(("127.0.0.1", load_fleet(fleet).instances()[0].port))
        squatter.listen()
        done = await asyncio.to_thread(
            subprocess.run, [FLEETGEN, "up", "-f", str(fleet)], capture_output=True, text=True, check=False
        )
    lines = (done.stdout + done.stderr).splitlines()
    assert [ln for ln in lines if repeated_clauses(ln) or ln.count("fix:") > 1] == [], lines
    [warning] = [i for i, ln in enumerate(lines) if "warning:" in ln]
    assert f"cannot read {tmp_path / 'model' / 'config.json'} on h0" in lines[warning]
    assert lines[warning].count("fix:") == 1 and "engine.model_config" in lines[warning]
    assert not lines[warning + 1].startswith("  "), lines  # no context or fix lines of its own below it
    assert done.returncode == 1  # the launch itself fails: the port is in use


async def test_up_refuses_an_argv_the_engines_own_rule_refuses_before_starting_anything(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    """Explicit no_buffer with the overlap scheduler on: plan's rule (0.5.23's, the sim's) says SGLang refuses
    it at start. `up` exits non-zero naming the rule and the instance, in plan's words with plan's fix, and
    started nothing; `--no-plan-check` launches it, and the engine's own refusal is read from its log (with
    the fix plan gives)."""
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], model=QWEN36, args={"mamba-radix-cache-strategy": "no_buffer"})
    file = load_fleet(fleet)
    port = file.instances()[0].port
    root = ssh_hosts[0].workdir / tmp_path.name / "h0-0"
    env = {**os.environ, "COLUMNS": "400"}
    facts = {h.name: facts_from_file(h) for h in file.hosts}
    plan = plan_fleet(file, load_model_shape(QWEN36), facts).instances[0]
    [refusal] = [e for e in plan.errors if e.rule == "no-buffer-overlap"]
    done = await asyncio.to_thread(
        subprocess.run,
        [FLEETGEN, "up", "-f", str(fleet)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert f"[no-buffer-overlap] h0-0: {refusal.message}" in said
    assert refusal.fix in said and "--no-plan-check" in said
    assert not (root / "pid").exists() and not log_files(root.parent, "h0-0")
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))

    [out] = await up(Fleet.load(fleet), plan_check=False)
    assert isinstance(out.error, LaunchFailed)
    assert refusal.message in str(out.error.context["matched"]) and out.error.fix == refusal.fix
    assert out.pid is not None and _is_gone(out.pid)


async def test_up_refuses_simulated_acceptance_before_anything_starts_and_tune_may_launch_it(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    """SGLANG_SIMULATE_ACC_LEN in [engine.env] commits tokens the model did not choose: `up`, `restart` and
    `run` exit 2 naming it, with nothing started on the host; the deploy path's explicit permission (what
    `tune` passes) launches it, and the server comes up verified."""
    env = {"SGLANG_SIMULATE_ACC_LEN": "3.0", "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}
    fleet = sim_fleet(tmp_path, ssh_hosts[:1], env=env)
    port = load_fleet(fleet).instances()[0].port
    root = ssh_hosts[0].workdir / tmp_path.name / "h0-0"
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    for argv in (["up"], ["restart"], ["run", str(prompts), "-o", str(tmp_path / "out")]):
        done = await asyncio.to_thread(
            subprocess.run, [FLEETGEN, *argv, "-f", str(fleet)], capture_output=True, text=True, check=False
        )
        said = " ".join(done.stderr.split())
        assert done.returncode == 2, (argv, done.stderr)
        assert "SGLANG_SIMULATE_ACC_LEN=3.0, SGLANG_SIMULATE_ACC_METHOD=match-expected" in said
        assert "fix: remove these settings from [engine.env]" in said
    assert not root.exists() and not (tmp_path / "out").exists()  # not even its folder on the host
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))
    try:
        [out] = await up(Fleet.load(fleet), allow_simulated_acceptance=True)
        _ok([out])
        assert out.pid is not None and "SGLANG_SIMULATE_ACC_LEN=3.0" in _read(root / "launch.sh")
    finally:
        await down(Fleet.load(fleet))
