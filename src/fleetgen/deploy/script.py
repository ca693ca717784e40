"""The launch script of one instance, rendered from what the plan and the engine decided.

The script is the single source of truth for how an engine runs: `set -euo pipefail`, the environment
exported line by line, then `exec <python> <launcher> <argv>` so the engine *is* the spawned PID and its
argv/environ in /proc can be compared with what was rendered here. Every value is shell-quoted.

Secrets never enter the script (nor fleetgen's state or logs): an API key is written by fleetgen to a 0600
file next to the script and the script reads it into the environment at start (`"$(cat FILE)"`), so the
rendered text and its sha256 are identical whatever the key is.
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# What a diff or the state shows where a secret would be.
REDACTED = "<redacted>"


@dataclass(frozen=True)
class InstancePaths:
    """Where an instance lives on its host: `<workdir>/<instance>/…`."""

    workdir: str
    instance: str

    @property
    def root(self) -> str:
        return posixpath.join(self.workdir, self.instance)

    @property
    def script(self) -> str:
        return posixpath.join(self.root, "launch.sh")

    @property
    def pidfile(self) -> str:
        return posixpath.join(self.root, "pid")

    @property
    def keyfile(self) -> str:
        return posixpath.join(self.root, "api_key")

    @property
    def logs(self) -> str:
        return posixpath.join(self.root, "logs")

    @property
    def current_log(self) -> str:
        return posixpath.join(self.logs, "current.log")

    def log_for(self, utc_stamp: str) -> str:
        """A new log file per launch: old logs stay intact for post-mortems."""
        return posixpath.join(self.logs, f"{utc_stamp}.log")


@dataclass(frozen=True)
class SecretEnv:
    """An API key the script reads into variable `name` from the 0600 key file at start.

    The engine refers to it on its argv as `${name}` (see `engines.base.api_key_reference`); the script
    expands that token, so the rendered text never holds the key.
    """

    name: str

    @property
    def reference(self) -> str:
        return f"${{{self.name}}}"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that decides how one instance runs; equal specs mean an equal running process."""

    instance: str
    python: str
    launcher: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str]
    paths: InstancePaths
    secret: SecretEnv | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        """The process argv as rendered; a key on the argv shows as its `${NAME}` reference."""
        return (self.python, *self.launcher, *self.args)

    @property
    def environ(self) -> dict[str, str]:
        """The environment the script exports, the key as REDACTED (inherited variables are not ours)."""
        env = dict(self.env)
        if self.secret:
            env[self.secret.name] = REDACTED
        return env


def render_script(spec: LaunchSpec) -> str:
    """The bash text of `launch.sh` for `spec`. Pure; contains no secret."""
    lines = [
        "#!/usr/bin/env bash",
        f"# fleetgen launch script for instance {spec.instance}: rewritten by `fleetgen up`, do not edit.",
        "set -euo pipefail",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(spec.env.items())]
    if spec.secret:
        # Read at start from a 0600 file so the key is never part of this text or its checksum.
        lines.append(f'{spec.secret.name}="$(cat {shlex.quote(spec.paths.keyfile)})"')
        lines.append(f"export {spec.secret.name}")
    lines.append("exec " + " ".join(_quote(part, spec.secret) for part in spec.argv))
    return "\n".join(lines) + "\n"


def _quote(part: str, secret: SecretEnv | None) -> str:
    if secret and part == secret.reference:
        return f'"{part}"'  # the one token the shell must expand: the key, read from its file above
    return shlex.quote(part)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def redact_argv(argv: Sequence[str], spec: LaunchSpec, secret_value: str | None) -> tuple[str, ...]:
    """A running process's argv with the key shown as its `${NAME}` reference, for comparison and display."""
    if not spec.secret or not secret_value:
        return tuple(argv)
    return tuple(spec.secret.reference if part == secret_value else part for part in argv)


def redact_environ(environ: Mapping[str, str], spec: LaunchSpec, secret_value: str | None) -> dict[str, str]:
    """The subset of a running process's environ that `spec` manages, the key replaced by a marker.

    The key reads as REDACTED when it equals `secret_value` and as `<different key>` when not, so a rotated
    key shows up as drift without ever being printed.
    """
    out = {name: environ[name] for name in spec.environ if name in environ}
    if spec.secret and spec.secret.name in out:
        out[spec.secret.name] = REDACTED if out[spec.secret.name] == secret_value else "<different key>"
    return out
