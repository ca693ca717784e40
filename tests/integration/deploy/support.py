"""Helpers for the deploy integration tests (no tests here): fleet files for the real test sshd hosts."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.fixtures.ports import free_ports
from tests.fixtures.sshd import SshdHost

ArgValue = str | int | float | bool


def toml_value(value: ArgValue | Sequence[str]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(json.dumps(v) for v in value) + "]"


def write_fleet(
    path: Path,
    hosts: Sequence[SshdHost],
    *,
    kind: str,
    python: str,
    model: str,
    workdir_tag: str,
    gpus: Sequence[int] = (0,),
    launcher: Sequence[str] | None = None,
    args: Mapping[str, ArgValue] | None = None,
    env: Mapping[str, str] | None = None,
    served_model_name: str | None = None,
    ready_timeout_s: float = 120.0,
    base_ports: Sequence[int] | None = None,
) -> Path:
    """A fleet file reaching `hosts` over real SSH; each host gets its own workdir and free ports."""
    ports = list(base_ports) if base_ports else _spread_ports(len(hosts), len(gpus))
    lines = [
        "[engine]",
        f"kind = {toml_value(kind)}",
        f"python = {toml_value(python)}",
        f"model = {toml_value(model)}",
        f"ready_timeout_s = {ready_timeout_s!r}",
    ]
    if launcher is not None:
        lines.append(f"launcher = {toml_value(list(launcher))}")
    if served_model_name:
        lines.append(f"served_model_name = {toml_value(served_model_name)}")
    lines += ["", "[engine.args]", *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in (args or {}).items())]
    lines += ["", "[engine.env]", *(f"{json.dumps(k)} = {toml_value(v)}" for k, v in (env or {}).items())]
    for host, port in zip(hosts, ports, strict=True):
        lines += [
            "",
            "[[hosts]]",
            f"name = {toml_value(host.name)}",
            f"ssh = {toml_value(host.ssh)}",
            f"identity = {toml_value(str(host.identity))}",
            f"known_hosts = {toml_value(str(host.known_hosts))}",
            f"workdir = {toml_value(str(host.workdir / workdir_tag))}",
            f"gpus = [{', '.join(map(str, gpus))}]",
            "gpu_memory_gib = 80.0",
            f"base_port = {port}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _spread_ports(num_hosts: int, per_host: int) -> list[int]:
    """Base ports whose ranges [base, base + per_host) do not overlap and are free right now."""
    while True:
        bases = free_ports(num_hosts)
        ranges = [set(range(b, b + per_host)) for b in bases]
        if all(
            not (ranges[i] & ranges[j]) for i in range(num_hosts) for j in range(i + 1, num_hosts)
        ) and all(_is_free(p) for r in ranges for p in r):
            return bases


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read(path: Path) -> str:
    """A file on a test host (they are this machine)."""
    return path.read_text()


def resolved(path: Path) -> Path:
    return path.resolve()


def log_files(workdir: Path, instance: str) -> list[Path]:
    """The timestamped launch logs of an instance (the test hosts are this machine: read them directly)."""
    return sorted(p for p in (workdir / instance / "logs").glob("*.log") if p.name != "current.log")
