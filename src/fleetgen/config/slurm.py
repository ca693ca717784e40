"""`[cluster] kind = "slurm"`: the servers are placed by a Slurm cluster; its fields, sbatch options fleetgen
manages, and the layout problems of a Slurm cluster (GPUs `tp` does not divide, servers wider than a node)."""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from fleetgen.config.hosts import HostName, Machine, SshTarget, gpus_problems

# sbatch options fleetgen sets on every job: refused in cluster.sbatch_args (the ones a [cluster] field sets
# name that field).
SBATCH_FIELDS = {"-p": "partition", "--partition": "partition", "-t": "time", "--time": "time"}
SBATCH_FIELDS |= {"-A": "account", "--account": "account"}
MANAGED_SBATCH = {"-J", "--job-name", "-o", "--output", "-e", "--error", "--parsable", "--test-only"}
MANAGED_SBATCH |= {"-N", "--nodes", "-n", "--ntasks", "-G", "--gpus", "--gres", "--gpus-per-node", "--wrap"}
MANAGED_SBATCH |= {"--gpus-per-task", "-D", "--chdir", *SBATCH_FIELDS}
# minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S (`sbatch --time`), or no limit
SLURM_TIME = re.compile(r"(?:\d+-)?\d+(?::\d{1,2}){0,2}|UNLIMITED|unlimited|infinite|INFINITE")


class SlurmCluster(Machine):
    """`[cluster] kind = "slurm"`: the servers are placed by a Slurm cluster, one job per server
    (`deploy.placement.slurm`).

    fleetgen runs `sbatch`/`squeue`/`scancel` on the submit host (`submit`: "local" = this machine, or
    `user@login:port` over SSH); the workdir is on the filesystem the submit host and the nodes share.
    Instances are named `<name>-<k>` (k < gpus / engine.tp) and listen on `base_port + k` on their node.
    """

    kind: Literal["slurm"]
    name: HostName = "slurm"
    partition: Annotated[str, Field(pattern=r"^[^\s,]+$")]
    gpus: Annotated[int, Field(ge=1, le=4096)]
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] | None = None
    time: str
    account: Annotated[str, Field(pattern=r"^\S+$")] | None = None
    sbatch_args: list[str] = Field(default_factory=list)
    submit: SshTarget = "local"
    node_access: Literal["local", "ssh", "srun"] = "ssh"
    node_ssh_user: str | None = None
    node_ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    pending_timeout_s: Annotated[float, Field(gt=0)] = 3600.0  # `up` waits this long for an allocation

    # Slurm hands each job its GPUs (and sets CUDA_VISIBLE_DEVICES): the launch exports none of its own
    assigns_devices: ClassVar[bool] = True

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if not SLURM_TIME.fullmatch(value):
            raise ValueError(
                f'{value!r} is no Slurm time limit: write minutes ("90"), "HH:MM:SS", "D-HH:MM:SS" '
                '(e.g. "3-00:00:00") or "UNLIMITED", as `sbatch --time` takes it'
            )
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _unmanaged(cls, args: list[str]) -> list[str]:
        for arg in args:
            option = arg.split("=", 1)[0]
            if option in MANAGED_SBATCH:
                field = SBATCH_FIELDS.get(option, "")
                where = f"set cluster.{field} instead" if field else "fleetgen sets it for every job"
                raise ValueError(f"{arg!r} is set by fleetgen: remove it from sbatch_args ({where})")
        return args

    @property
    def time_limit_s(self) -> int | None:
        """`time` in seconds; None for no limit."""
        return slurm_time_s(self.time)

    @property
    def qos(self) -> str | None:
        """The QOS sbatch_args ask for (`--qos=Q`, `--qos Q`, `-q Q`, `-qQ`; sbatch takes the last), else
        None: the account's default."""
        found = None
        for arg, after in pairwise([*self.sbatch_args, ""]):
            if arg.startswith("--qos="):
                found = arg.removeprefix("--qos=")
            elif arg in ("--qos", "-q") and after:
                found = after
            elif arg.startswith("-q") and len(arg) > 2 and not arg.startswith("--"):
                found = arg.removeprefix("-q")
        return found

    def submit_host(self) -> dict[str, Any]:
        """The `[[hosts]]` entry the cluster stands for: the submit host, its GPUs the cluster's (slots
        0…gpus-1, one instance per `tp` of them; Slurm picks the real devices on the node)."""
        values = self.model_dump(include={"name", *Machine.model_fields}, exclude_none=True)
        return {**values, "ssh": self.submit, "gpus": list(range(self.gpus))}

    def problems(self, tp: int) -> list[tuple[tuple[int | str, ...], str]]:
        """The cluster's GPUs `tp` does not divide, and servers wider than a node."""
        problems = gpus_problems(self.gpus, tp)
        if self.gpus_per_node is not None and tp > self.gpus_per_node:
            why = (
                f"engine.tp = {tp} is more than a node's {self.gpus_per_node} GPUs: one server runs on "
                "one node here; lower engine.tp or fix gpus_per_node"
            )
            problems.append((("cluster", "gpus_per_node"), why))
        return problems


def slurm_time_s(value: str) -> int | None:
    """A Slurm time limit (`SLURM_TIME`: as `sbatch --time` takes it and `scontrol` writes MaxTime) in
    seconds; None for no limit ("UNLIMITED", and 0, which sbatch reads as no limit)."""
    if value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, has_days, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if has_days:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:  # M, M:S, H:M:S
        hours, minutes, seconds = [0, *parts, 0][:3] if len(parts) < 3 else parts
    total = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    return total or None
