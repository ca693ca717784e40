"""Deploy overhead: `fleetgen up` of 8 instances over 2 real sshd hosts, minus the servers' own start.

The server is the instant-start sim (`python -m fleetgen.sim` as the SGLang launcher). Its own start is
measured the same way the fleet starts it: 8 at once on this machine, spawn → every /health 200. The
overhead is `up`'s wall time (SSH, checks, script push, verify, read-back) minus that.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import common
from common import Context, Row

sys.path.insert(0, str(common.REPO))
from tests.fixtures.sshd import SSHD, SshdHost, SshKeys, start_sshd  # the real sshd bed, after sys.path

NUM_HOSTS = 2
GPUS_PER_HOST = 4


def keys(root: Path) -> SshKeys:
    root.mkdir(parents=True, exist_ok=True)
    k = SshKeys(identity=root / "id_ed25519", wrong_identity=root / "wrong", known_hosts=root / "known_hosts")
    for path in (k.identity, k.wrong_identity):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    k.known_hosts.write_text("")
    return k


def fleet_toml(hosts: list[SshdHost], path: Path, base_ports: list[int]) -> Path:
    lines = [
        "[engine]",
        'kind = "sglang"',
        f'python = "{common.FLEETGEN_PY}"',
        'launcher = ["-m", "fleetgen.sim"]',
        f'model = "{common.TINY_MODEL}"',
        "ready_timeout_s = 120",
        "",
        "[engine.args]",
        "sim-decode-tps = 0",
        "",
    ]
    for host, port in zip(hosts, base_ports, strict=True):
        lines += [*host.hosts_entry(range(GPUS_PER_HOST), base_port=port), ""]
    path.write_text("\n".join(lines))
    return path


def sims_start_together(ctx: Context, num: int) -> float:
    """Spawn `num` sims at once; seconds until all answer /health."""
    sim = [str(common.FLEETGEN_PY), "-m", "fleetgen.sim", "--model-path", str(common.TINY_MODEL)]
    ports = [common.free_port() for _ in range(num)]
    servers = [
        (
            [*sim, "--host", "127.0.0.1", "--port", str(port), "--sim-decode-tps", "0"],
            port,
            ctx.workdir / f"alone-{k}.log",
        )
        for k, port in enumerate(ports)
    ]
    return common.start_together(servers, 120)


def free_block(size: int) -> int:
    """A base port whose next `size` ports are free now."""
    for _ in range(50):
        base = common.free_port()
        if base + size < 65000 and all(_is_free(base + k) for k in range(size)):
            return base
    raise RuntimeError("no free block of ports on 127.0.0.1")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run(ctx: Context) -> list[Row]:
    common.need_fleetgen_command("up")
    if not SSHD.exists():
        raise common.Skip("needs /usr/sbin/sshd (apt-get install openssh-server)")
    if not (common.REPO / "src" / "fleetgen" / "sim" / "__main__.py").exists():
        raise common.Skip("fleetgen.sim has no __main__ yet")
    os.makedirs("/run/sshd", exist_ok=True)
    k = keys(ctx.workdir / "keys")
    hosts = [start_sshd(ctx.workdir / "hosts", f"h{i}", k) for i in range(NUM_HOSTS)]
    try:
        fleet = fleet_toml(hosts, ctx.workdir / "fleet.toml", [free_block(GPUS_PER_HOST) for _ in hosts])
        num = NUM_HOSTS * GPUS_PER_HOST
        alone = sims_start_together(ctx, num)
        common.log(f"deploy: {num} sims alone start in {alone:.2f} s; now fleetgen up")
        up = common.measure(
            [str(common.FLEETGEN_BIN), "up", "-f", str(fleet)], ctx.workdir / "up.log", timeout_s=600
        )
        down = common.measure([str(common.FLEETGEN_BIN), "down", "-f", str(fleet)], ctx.workdir / "down.log")
        if up.returncode != 0:
            raise RuntimeError(f"fleetgen up exited {up.returncode}:\n{up.log_tail()}")
    finally:
        for host in hosts:
            host.stop()
        shutil.rmtree(ctx.workdir / "keys", ignore_errors=True)
    overhead = up.wall_s - alone
    ctx.details["deploy"] = {
        "instances": num,
        "hosts": NUM_HOSTS,
        "up_wall_s": up.wall_s,
        "servers_alone_s": alone,
        "overhead_s": overhead,
        "up_cpu_s": up.cpu_s,
        "down_wall_s": down.wall_s,
    }
    return [
        Row(
            "deploy",
            f"`up` {num} instances / {NUM_HOSTS} sshd hosts: wall",
            "s",
            {"fleetgen": up.wall_s, "server": alone},
        ),
        Row(
            "deploy",
            "`up` overhead = wall − servers' own start",
            "s",
            {"fleetgen": overhead},
            target="≤ 2 s",
            is_met=overhead <= 2,
        ),
        Row("deploy", "`down` wall", "s", {"fleetgen": down.wall_s}),
    ]
