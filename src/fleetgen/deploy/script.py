"""The launch script of one instance, rendered from what the plan and the engine decided.

The script is the single source of truth for how an engine runs: `set -euo pipefail`, the environment
exported line by line, then `exec <python> <launcher> <argv>` so the engine *is* the spawned PID and its
argv/environ in /proc can be compared with what was rendered here. Every value is shell-quoted.

Secrets never enter the script, argv, fleetgen's state or the logs. An API key is written by fleetgen to a
0600 file in the instance's 0700 folder; the script reads it into the environment at start (`"$(cat FILE)"`)
so the rendered text and its sha256 are identical whatever the key is. An engine with an env var for its key
(vLLM: VLLM_API_KEY) reads it from there; one without (SGLang) is given `--config FILE.yaml`, a second 0600
file holding `api-key: KEY`. fleetgen removes both files once the engine has started. The engine's output
goes through `REDACTOR` (the engine's own python, the key from its environment) before it reaches the log:
engines print their own arguments at start (SGLang's `server_args=…` holds `api_key`). `umask 077`: what
the engine writes is its owner's only.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from fleetgen.plan import API_KEY_CONFIG
from fleetgen.redact import REDACTED

# Copies stdin to stdout with the key (from the env var named by argv[1]) replaced, keeping back only a tail
# that could be the start of a key; never dies of TERM/INT/HUP, so the engine's last words still reach the
# log (it ends at EOF, when the engine and its children are gone, or with the group's KILL).
REDACTOR = f"""import os, signal, sys
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
key, mark, pending = os.environb[sys.argv[1].encode()], {REDACTED.encode()!r}, b""
while True:
    chunk = os.read(0, 65536)
    pending = (pending + chunk).replace(key, mark)
    keep = 0 if not chunk else next(
        (n for n in range(min(len(key) - 1, len(pending)), 0, -1) if key.startswith(pending[-n:])), 0)
    out, pending = pending[: len(pending) - keep], pending[len(pending) - keep :]
    while out:
        out = out[os.write(1, out) :]
    if not chunk:
        break
"""


@dataclass(frozen=True)
class InstancePaths:
    """Where an instance lives on its host: `<workdir>/<instance>/…`. `key_config`: the YAML config an engine
    without a key env var reads its key from (SGLang's `--config`)."""

    root: str
    script: str
    pidfile: str
    keyfile: str
    key_config: str
    logs: str

    @classmethod
    def of(cls, workdir: str, instance: str) -> InstancePaths:
        root = posixpath.join(workdir, instance)
        names = ("launch.sh", "pid", "api_key", API_KEY_CONFIG, "logs")
        return cls(root, *(posixpath.join(root, name) for name in names))

    @property
    def current_log(self) -> str:
        return posixpath.join(self.logs, "current.log")

    def new_log(self) -> str:
        """A new log file per launch, named by the time: old logs stay intact for post-mortems."""
        return posixpath.join(self.logs, datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ.log"))


@dataclass(frozen=True)
class SecretEnv:
    """An API key the script reads into variable `name` from the 0600 key file at start.

    `config_key`: the engine takes its key from a YAML config file (`--config`, on the argv by name), under
    this key (`api-key`); None when the engine reads variable `name` itself (vLLM's VLLM_API_KEY).
    """

    name: str
    config_key: str | None = None


@dataclass(frozen=True)
class Command:
    """Everything that decides how one instance runs; equal commands mean an equal running process."""

    instance: str
    python: str
    launcher: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str]
    paths: InstancePaths
    secret: SecretEnv | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        """The process argv as rendered (never a key)."""
        return (self.python, *self.launcher, *self.args)

    def secret_files(self, secret_value: str) -> dict[str, bytes]:
        """The 0600 files fleetgen pushes before a launch and removes once the engine started."""
        if self.secret is None:
            return {}
        files = {self.paths.keyfile: secret_value.encode()}
        if self.secret.config_key:
            # A JSON string is a YAML double-quoted scalar (the key is ASCII).
            files[self.paths.key_config] = f"{self.secret.config_key}: {json.dumps(secret_value)}\n".encode()
        return files

    @property
    def environ(self) -> dict[str, str]:
        """The environment the script exports, the key as REDACTED (inherited variables are not ours)."""
        env = dict(self.env)
        if self.secret:
            env[self.secret.name] = REDACTED
        return env


def render_script(command: Command) -> str:
    """The bash text of `launch.sh` for `command`. Pure; contains no secret."""
    lines = [
        "#!/usr/bin/env bash",
        f"# fleetgen launch script for instance {command.instance}: rewritten by `fleetgen up`, do not edit.",
        "set -euo pipefail",
        "umask 077",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(command.env.items())]
    if command.secret:
        # Read at start from a 0600 file so the key is never part of this text or its checksum.
        name = command.secret.name
        lines.append(f'{name}="$(cat {shlex.quote(command.paths.keyfile)})"')
        lines.append(f"export {name}")
        # The engine prints its own arguments: its output reaches the log with the key redacted.
        redactor = shlex.join([command.python, "-u", "-c", REDACTOR, name])
        lines.append(f"exec > >(exec {redactor}) 2>&1")
    lines.append("exec " + shlex.join(command.argv))
    return "\n".join(lines) + "\n"
