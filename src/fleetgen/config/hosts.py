"""`[[hosts]]`: one machine reached over SSH, what `[cluster]` says alike (`Machine`), the SSH target form.

`Machine` is what `[cluster]` says alike of its submit host: identity, known_hosts, workdir, base_port,
memory, a `HostName`. The SSH target form (`SshTarget`) is checked by `ssh_form`; `[cluster].submit` takes it
too. A host's own `engine_args` go over `[engine.args]`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator

from fleetgen.config.common import Strict
from fleetgen.config.engine import EngineArgs, check_arg_names


def ssh_form(value: str) -> str:
    """`user@host:port`, `host` or `local` (an SSH target as fleet files write it)."""
    if value != "local" and not re.fullmatch(r"(?:[^@\s]+@)?[^@:\s]+(?::\d{1,5})?", value):
        raise ValueError(f"expected 'user@host:port', 'host' or 'local', got {value!r}")
    return value


SshTarget = Annotated[str, AfterValidator(ssh_form)]
HostName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


class Machine(Strict):
    """What `[[hosts]]` and `[cluster]` (standing as its submit host) both say of a machine."""

    identity: str | None = None
    known_hosts: str | None = None
    workdir: str = "~/fleetgen"
    base_port: Annotated[int, Field(ge=1024, le=65000)] | None = None
    gpu_memory_gib: Annotated[float, Field(gt=0)] | None = None
    host_memory_gib: Annotated[float, Field(gt=0)] | None = None


class HostEntry(Machine):
    """`[[hosts]]`: one machine reached over SSH (or `ssh = "local"`)."""

    name: HostName
    ssh: SshTarget = "local"
    insecure_skip_host_key_check: bool = False
    gpus: list[int] | Literal["all"] = "all"
    gpu_free_gib: Annotated[float, Field(gt=0)] | None = None
    # this host's engine flags over `[engine.args]` (its GPUs want other settings: `fleetgen tune` writes it
    # when GPU classes choose differently); merged by `FleetFile.engine_for`, the one place
    engine_args: EngineArgs = Field(default_factory=dict)

    @field_validator("engine_args")
    @classmethod
    def _no_managed_flags(cls, args: dict[str, Any]) -> dict[str, Any]:
        return check_arg_names(args, "this host's engine_args")

    @field_validator("gpus")
    @classmethod
    def _distinct_gpus(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, list) and not value:
            raise ValueError(
                "an empty GPU list starts no instance on this host: list its GPUs (gpus = [0, 1]), "
                'write gpus = "all", or remove this [[hosts]] entry'
            )
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError(f"GPU indices repeat in {value}: two instances would share one GPU")
        return value

    @property
    def is_local(self) -> bool:
        return self.ssh == "local"

    @property
    def user(self) -> str | None:
        return self.ssh.rpartition("@")[0] or None

    @property
    def address(self) -> str:
        return self.ssh.rpartition("@")[2].partition(":")[0]

    @property
    def port(self) -> int:
        return int(self.ssh.rpartition("@")[2].partition(":")[2] or 22)


def gpus_problems(gpus: int, tp: int) -> list[tuple[tuple[int | str, ...], str]]:
    """A `[cluster]`'s `gpus` that `tp` does not divide (servers = gpus / tp), with the counts that work."""
    if not gpus % tp:
        return []
    fit = gpus // tp * tp
    why = (
        f"gpus = {gpus} is no multiple of engine.tp = {tp} (servers = gpus / tp): "
        f"set gpus = {fit or tp}{f' or {fit + tp}' if fit else ''}, or change engine.tp"
    )
    return [(("cluster", "gpus"), why)]
