"""The files users write: the fleet file (TOML) and the job file (TOML).

Models are frozen and strict (`extra="forbid"`): a typo is an error naming the file, the line and the field,
never a silently ignored key. Derived values (instances, ports) are properties, not stored state.
Pure: `load_fleet` / `load_job` read one file; nothing here touches a host.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from fleetgen.errors import ConfigError

ArgValue = str | int | float | bool
LOOPBACK = "127.0.0.1"


# The engine kinds a fleet file may name. `fleetgen.engines` registers each of its engines here when it is
# imported (the package's `__init__` imports it first): config sits left of engines and cannot ask it.
ENGINE_KINDS: list[str] = []


def register_engine_kind(name: str) -> None:
    """Let fleet files name engine `name` (called by the engine registry, `fleetgen.engines`)."""
    if name not in ENGINE_KINDS:
        ENGINE_KINDS.append(name)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineConfig(_Strict):
    """`[engine]`: what to run on every instance."""

    kind: str
    version: str | None = None
    python: str = "python3"
    model: str
    model_config_dir: str | None = Field(default=None, alias="model_config")
    served_model_name: str | None = None
    launcher: tuple[str, ...] | None = None  # None: the engine's own (`engines.launcher_of`)
    args: dict[str, ArgValue | list[ArgValue]] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    base_port: Annotated[int, Field(ge=1024, le=65000)] = 30000
    bind: str = LOOPBACK
    api_key_env: str | None = None
    ready_timeout_s: Annotated[float, Field(gt=0)] = 1800.0

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("kind")
    @classmethod
    def _known_engine(cls, kind: str) -> str:
        if kind not in ENGINE_KINDS:
            known = ", ".join(repr(k) for k in ENGINE_KINDS) or "none (fleetgen.engines was not imported)"
            raise ValueError(f"unknown engine {kind!r}; known engines: {known}")
        return kind

    @field_validator("args")
    @classmethod
    def _no_managed_flags(cls, args: dict[str, Any]) -> dict[str, Any]:
        for key in args:
            if key.startswith("-"):
                raise ValueError(f"write flag names without dashes: {key.lstrip('-')!r}, not {key!r}")
            if key in {"host", "port", "api-key"}:
                raise ValueError(f"'{key}' is set by fleetgen per instance; remove it from engine.args")
        return args

    @model_validator(mode="after")
    def _public_bind_needs_key(self) -> EngineConfig:
        if self.bind != LOOPBACK and not self.api_key_env:
            raise ValueError(
                f"bind = {self.bind!r} exposes the servers beyond this host; set engine.api_key_env to the "
                "name of an environment variable holding an API key, or keep bind = '127.0.0.1' (SSH tunnels)"
            )
        return self

    @property
    def is_public(self) -> bool:
        return self.bind != LOOPBACK


def ssh_form(value: str) -> str:
    """`user@host:port`, `host` or `local` (an SSH target as fleet files write it)."""
    if value != "local" and not re.fullmatch(r"(?:[^@\s]+@)?[^@:\s]+(?::\d{1,5})?", value):
        raise ValueError(f"expected 'user@host:port', 'host' or 'local', got {value!r}")
    return value


class HostEntry(_Strict):
    """`[[hosts]]`: one machine reached over SSH (or `ssh = "local"`)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    ssh: str = "local"
    identity: str | None = None
    known_hosts: str | None = None
    insecure_skip_host_key_check: bool = False
    gpus: list[int] | Literal["all"] = "all"
    gpu_memory_gib: Annotated[float, Field(gt=0)] | None = None
    gpu_free_gib: Annotated[float, Field(gt=0)] | None = None
    host_memory_gib: Annotated[float, Field(gt=0)] | None = None
    workdir: str = "~/fleetgen"
    base_port: Annotated[int, Field(ge=1024, le=65000)] | None = None

    @field_validator("ssh")
    @classmethod
    def _ssh_form(cls, value: str) -> str:
        return ssh_form(value)

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
        return self.ssh.split("@", 1)[0] if "@" in self.ssh else None

    @property
    def address(self) -> str:
        rest = self.ssh.split("@", 1)[-1]
        return rest.rsplit(":", 1)[0] if ":" in rest else rest

    @property
    def port(self) -> int:
        rest = self.ssh.split("@", 1)[-1]
        return int(rest.rsplit(":", 1)[1]) if ":" in rest else 22


# sbatch options fleetgen sets on every job: refused in cluster.sbatch_args (the ones a [cluster] field sets
# name that field).
SBATCH_FIELDS = {"-p": "partition", "--partition": "partition", "-t": "time", "--time": "time"}
SBATCH_FIELDS |= {"-A": "account", "--account": "account"}
MANAGED_SBATCH = {"-J", "--job-name", "-o", "--output", "-e", "--error", "--parsable", "--test-only"}
MANAGED_SBATCH |= {"-N", "--nodes", "-n", "--ntasks", "-G", "--gpus", "--gres", "--gpus-per-node", "--wrap"}
MANAGED_SBATCH |= {"--gpus-per-task", "-D", "--chdir", *SBATCH_FIELDS}
# minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S (`sbatch --time`), or no limit
SLURM_TIME = re.compile(r"(?:\d+-)?\d+(?::\d{1,2}){0,2}|UNLIMITED|unlimited|infinite|INFINITE")


class ClusterConfig(_Strict):
    """`[cluster]`: the servers are placed by a Slurm cluster, one job per server (`deploy.slurm`).

    fleetgen runs `sbatch`/`squeue`/`scancel` on the submit host (`submit`: "local" = this machine, or
    `user@login:port` over SSH); the workdir is on the filesystem the submit host and the nodes share.
    Instances are named `<name>-<k>` (k < gpus / engine.tp) and listen on `base_port + k` on their node.
    """

    kind: Literal["slurm"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] = "slurm"
    partition: Annotated[str, Field(pattern=r"^[^\s,]+$")]
    gpus: Annotated[int, Field(ge=1, le=4096)]
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] | None = None
    time: str
    account: Annotated[str, Field(pattern=r"^\S+$")] | None = None
    sbatch_args: list[str] = Field(default_factory=list)
    submit: str = "local"
    identity: str | None = None
    known_hosts: str | None = None
    node_access: Literal["local", "ssh", "srun"] = "ssh"
    node_ssh_user: str | None = None
    node_ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    workdir: str = "~/fleetgen"
    base_port: Annotated[int, Field(ge=1024, le=65000)] | None = None
    gpu_memory_gib: Annotated[float, Field(gt=0)] | None = None
    host_memory_gib: Annotated[float, Field(gt=0)] | None = None
    pending_timeout_s: Annotated[float, Field(gt=0)] = 3600.0  # `up` waits this long for an allocation

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

    @field_validator("submit")
    @classmethod
    def _submit_form(cls, value: str) -> str:
        return ssh_form(value)

    def submit_host(self) -> dict[str, Any]:
        """The `[[hosts]]` entry the cluster stands for: the submit host, its GPUs the cluster's (slots
        0…gpus-1, one instance per `tp` of them; Slurm picks the real devices on the node)."""
        shared = HostEntry.model_fields.keys() & ClusterConfig.model_fields.keys()  # named alike, meant alike
        values = self.model_dump(include=shared, exclude_none=True)
        return {**values, "ssh": self.submit, "gpus": list(range(self.gpus))}


class Instance(_Strict):
    """One engine server: `tp` GPUs of one host, one port. Derived from the fleet file, never written."""

    name: str
    host: str
    gpus: tuple[int, ...]
    port: int
    index: int


class FleetFile(_Strict):
    """A whole fleet file."""

    engine: EngineConfig
    hosts: list[HostEntry] = Field(default_factory=list)
    cluster: ClusterConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_placement(cls, data: Any) -> Any:
        """`[[hosts]]` (SSH hosts) or `[cluster]` (Slurm), exactly one; a valid cluster stands as one host,
        the submit host, so everything that walks `hosts` (plan, select, status) sees the same fleet."""
        if not isinstance(data, dict):
            return data
        has_hosts, has_cluster = bool(data.get("hosts")), "cluster" in data
        if has_hosts and has_cluster:
            raise ValueError(
                "the fleet file has both [[hosts]] and [cluster]: a fleet is placed on SSH hosts or by a "
                "Slurm cluster, not both; keep one (two fleet files for two placements)"
            )
        if not has_hosts and not has_cluster:
            raise ValueError(
                "no [[hosts]] and no [cluster]: add [[hosts]] entries (SSH hosts) or a [cluster] table "
                '(kind = "slurm"); `fleetgen init` writes an example'
            )
        if has_cluster:
            try:
                cluster = ClusterConfig.model_validate(data["cluster"])
            except ValidationError:
                return data  # reported by the field's own validation, with its location
            return {**data, "hosts": [cluster.submit_host()]}
        return data

    @property
    def is_slurm(self) -> bool:
        return self.cluster is not None

    @model_validator(mode="after")
    def _unique_hosts(self) -> FleetFile:
        names = [h.name for h in self.hosts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"host names repeat: {', '.join(dupes)}; every [[hosts]] needs its own name")
        return self

    @model_validator(mode="after")
    def _layout(self) -> FleetFile:
        """GPU lists `tp` divides, and no host named like another host's instance (`gpu` + `gpu-1`)."""
        problems = layout_problems(self)
        if problems:
            raise ValidationError.from_exception_data(
                "FleetFile",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("fleet_layout", "{why}", {"why": why}), loc=loc, input=None
                    )
                    for loc, why in problems
                ],
            )
        return self

    def host(self, name: str) -> HostEntry:
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(
            f"no host named {name!r}", fix=f"use one of: {', '.join(h.name for h in self.hosts)}"
        )

    def instances_on(
        self, host: HostEntry, gpu_indices: Sequence[int] | None = None, *, source: Path | None = None
    ) -> list[Instance]:
        """Instances of one host: one per `tp` GPUs, in GPU order; `gpu_indices` resolves `gpus = "all"`
        (None: not detected, planned as GPU 0). Detected GPUs that `tp` does not divide, or none, are refused
        (naming `source`'s line when given)."""
        tp = self.engine.tp
        if host.gpus != "all":
            gpus = list(host.gpus)
        elif gpu_indices is None:
            gpus = list(range(tp))
        else:
            gpus = list(gpu_indices)
            why = _gpu_count_problem(gpus, tp, f'gpus = "all" found {_gpu_list(gpus)} on {host.name}')
            if why:
                where = self.where(source, ("hosts", self.hosts.index(host), "gpus"))
                usable = gpus[: len(gpus) // tp * tp]
                example = f"gpus = {_gpu_list(usable)}" if usable else "another host"
                raise ConfigError(
                    f"{where}: {why}",
                    fix=f"list the GPUs to use in host {host.name}'s entry, a multiple of {tp} ({example}), "
                    "or change engine.tp",
                    context={"host": host.name},
                )
        base = host.base_port if host.base_port is not None else self.engine.base_port
        return [
            Instance(
                name=instance_name(host.name, k),
                host=host.name,
                gpus=tuple(gpus[k * tp : (k + 1) * tp]),
                port=base + k,
                index=k,
            )
            for k in range(len(gpus) // tp)
        ]

    def instances(
        self, detected: Mapping[str, Sequence[int]] | None = None, *, source: Path | None = None
    ) -> list[Instance]:
        """Every instance of the fleet; `detected` maps host name → GPU indices for `gpus = "all"` hosts."""
        detected = detected or {}
        return [
            inst for h in self.hosts for inst in self.instances_on(h, detected.get(h.name), source=source)
        ]

    def where(self, source: Path | None, loc: tuple[int | str, ...]) -> str:
        """`file:line: field` for a field of this fleet file (`field` alone without a source)."""
        field = dotted(loc)
        if source is None:
            return field
        try:
            line = locate(source.read_text(encoding="utf-8"), loc)
        except OSError:
            line = None
        return f"{source}:{line}: {field}" if line else f"{source}: {field}"

    def select(self, only: Sequence[str] | None) -> Selection:
        """What `--only NAME…` picks (instance or host names), host by host; an unknown name is an error."""
        if not only:
            return Selection({h.name: None for h in self.hosts})
        whole = {h.name for h in self.hosts if h.name in only}
        named: dict[str, set[str]] = {}
        unknown = []
        for name in only:
            host = self._host_name_of(name)
            if host is not None:
                named.setdefault(host, set()).add(name)
            elif name not in whole:
                unknown.append(name)
        if unknown:
            raise ConfigError(
                f"no instance or host is named {', '.join(map(repr, unknown))}",
                fix=f"use host names ({', '.join(h.name for h in self.hosts)}) or instance names "
                f"({', '.join(self._listed()) or '<host>-<k>'}); `fleetgen status` lists the instances",
            )
        return Selection(
            {
                h.name: None if h.name in whole else frozenset(named[h.name])
                for h in self.hosts
                if h.name in whole or h.name in named
            }
        )

    def host_of_instance(self, name: str) -> HostEntry:
        """The host an instance name belongs to, from the expanded fleet (never a prefix match)."""
        found = self._host_name_of(name)
        if found is None:
            raise ConfigError(
                f"no instance named {name!r}",
                fix="`fleetgen status` lists the instances (host names are not instance names)",
            )
        return self.host(found)

    def _listed(self) -> dict[str, str]:
        """Instance → host name, for the hosts whose GPUs the file lists."""
        return {i.name: i.host for h in self.hosts if h.gpus != "all" for i in self.instances_on(h)}

    def _host_name_of(self, name: str) -> str | None:
        """The host whose instance `name` is: a listed one, or the `gpus = "all"` host it would be
        (`<host>-<k>` exactly)."""
        if name in (listed := self._listed()):
            return listed[name]
        return next((h.name for h in self.hosts if h.gpus == "all" and _index_in(h, name)), None)


def _index_in(host: HostEntry, name: str) -> re.Match[str] | None:
    """`name` as `<host>-<k>` (k its instance index, no leading zero), else None."""
    return re.fullmatch(re.escape(host.name) + r"-(0|[1-9][0-9]*)", name)


def dotted(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the file's reader writes it: `hosts[1].gpus`."""
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")


def instance_name(host: str, index: int) -> str:
    """`<host>-<k>`: unique across a fleet, since host names are and the last `-k` is the index."""
    return f"{host}-{index}"


@dataclass(frozen=True)
class Selection:
    """What `--only` picks, host by host: None = every instance of that host, else these instance names."""

    picks: Mapping[str, frozenset[str] | None]

    def hosts(self, fleet: FleetFile) -> list[HostEntry]:
        return [h for h in fleet.hosts if h.name in self.picks]

    def pick(self, host: str, instances: Sequence[Instance]) -> list[Instance]:
        """The picked ones among a host's expanded instances; a picked name the host lacks is an error."""
        wanted = self.picks.get(host, frozenset())
        if wanted is None:
            return list(instances)
        missing = sorted(wanted - {i.name for i in instances})
        if missing:
            have = ", ".join(i.name for i in instances) or "none"
            raise ConfigError(
                f"host {host} has no instance {', '.join(missing)} (it has: {have})",
                fix="`fleetgen status` lists the instances",
                context={"host": host},
            )
        return [i for i in instances if i.name in wanted]

    def names(self, host: str, instances: Sequence[Instance]) -> list[str]:
        """Picked instance names of a host without checking them (for a host that could not be reached)."""
        wanted = self.picks.get(host, frozenset())
        return [i.name for i in instances] if wanted is None else sorted(wanted)


def layout_problems(fleet: FleetFile) -> list[tuple[tuple[int | str, ...], str]]:
    """(field location, why + fix) for GPU lists `tp` does not divide and names two things could share."""
    problems: list[tuple[tuple[int | str, ...], str]] = []
    tp = fleet.engine.tp
    if fleet.cluster is not None:
        return cluster_problems(fleet.cluster, tp)
    for i, host in enumerate(fleet.hosts):
        if host.gpus != "all":
            why = _gpu_count_problem(list(host.gpus), tp, f"gpus = {_gpu_list(host.gpus)}")
            if why:
                k = len(host.gpus) // tp * tp
                fix = (
                    f"list a multiple of {tp} GPUs (gpus = {_gpu_list(host.gpus[:k])}) or change engine.tp"
                    if k
                    else f"list at least {tp} GPUs for this host or remove it (engine.tp is for every host)"
                )
                problems.append((("hosts", i, "gpus"), f"{why}; {fix}"))
    for j, other in enumerate(fleet.hosts):
        for host in fleet.hosts:
            clash = _name_clash(fleet, host, other.name)
            if clash:
                problems.append((("hosts", j, "name"), clash))
    return problems


def cluster_problems(cluster: ClusterConfig, tp: int) -> list[tuple[tuple[int | str, ...], str]]:
    """A cluster's GPUs `tp` does not divide, and servers wider than a node."""
    problems: list[tuple[tuple[int | str, ...], str]] = []
    if cluster.gpus % tp:
        fit = cluster.gpus // tp * tp
        why = (
            f"gpus = {cluster.gpus} is no multiple of engine.tp = {tp} (servers = gpus / tp): "
            f"set gpus = {fit or tp}{f' or {fit + tp}' if fit else ''}, or change engine.tp"
        )
        problems.append((("cluster", "gpus"), why))
    if cluster.gpus_per_node is not None and tp > cluster.gpus_per_node:
        why = (
            f"engine.tp = {tp} is more than a node's {cluster.gpus_per_node} GPUs: one server runs on "
            "one node here; lower engine.tp or fix gpus_per_node"
        )
        problems.append((("cluster", "gpus_per_node"), why))
    return problems


def _name_clash(fleet: FleetFile, host: HostEntry, name: str) -> str:
    """Why host name `name` is ambiguous with an instance of `host` (empty when it is not)."""
    match = _index_in(host, name)
    if match is None:
        return ""
    rename = f"rename host {name!r} (e.g. {name.replace('-', '_')!r})"
    if host.gpus == "all":
        return (
            f'host {name!r} is named like instance {match.group(1)} of host {host.name!r} (gpus = "all"; '
            f"instances are named <host>-<k>): --only, logs and down could not tell them apart; {rename}, "
            f"or list host {host.name!r}'s GPUs"
        )
    if name in {i.name for i in fleet.instances_on(host)}:
        return (
            f"host {name!r} has the name of instance {match.group(1)} of host {host.name!r} (instances are "
            f"named <host>-<k>): --only, logs and down could not tell them apart; {rename}"
        )
    return ""


def _gpu_count_problem(gpus: Sequence[int], tp: int, what: str) -> str:
    if not gpus:
        return f"{what}: no GPU, so no instance"
    unused = gpus[len(gpus) // tp * tp :]
    if not unused:
        return ""
    return (
        f"{what} with engine.tp = {tp} leaves GPU {', '.join(map(str, unused))} unused "
        f"({len(gpus) // tp} instance(s) of {tp} GPUs)"
    )


def _gpu_list(gpus: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, gpus)) + "]"


class JobFile(_Strict):
    """A job file: sampling and dispatch settings for `fleetgen run` (flags override it)."""

    id_field: str = "id"
    prompt_field: str = "prompt"
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] = 4096
    temperature: Annotated[float, Field(ge=0)] = 0.6
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    top_k: int | None = None
    seed: int | None = None
    samples: Annotated[int, Field(ge=1)] = 1
    thinking: bool = True
    system_prompt: str | None = None
    concurrency: Annotated[int, Field(ge=1)] | None = None
    max_retries: Annotated[int, Field(ge=0)] = 5
    request_timeout_s: Annotated[float, Field(gt=0)] = 3600.0
    max_consecutive_failures: Annotated[int, Field(ge=1)] = 50
    extra_body: dict[str, Any] = Field(default_factory=dict)

    def overridden(self, **flags: Any) -> JobFile:
        """This job with the command line's flags over it (a flag not given is None: it changes nothing)."""
        return self.model_copy(update={key: value for key, value in flags.items() if value is not None})


M = TypeVar("M", bound=BaseModel)


def load_fleet(path: Path) -> FleetFile:
    """Read and validate a fleet file; errors name the file, line and field."""
    return _load(path, FleetFile, "fleet file")


def load_job(path: Path) -> JobFile:
    """Read and validate a job file; errors name the file, line and field."""
    return _load(path, JobFile, "job file")


def _load(path: Path, model: type[M], what: str) -> M:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} {path}: {exc.strerror}", fix="check the path, or pass another with -f"
        ) from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8: another encoding, or a binary file by mistake
        raise ConfigError(
            f"the {what} {path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})",
            fix=f"save {path} as UTF-8 (TOML files are UTF-8), or pass another file",
        ) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", fix="fix the syntax at the line named") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _render_validation(path, text, exc),
            fix=f"edit {path} as the lines above say; `fleetgen init` writes a commented example",
        ) from exc


def _render_validation(path: Path, text: str, exc: ValidationError) -> str:
    lines = [f"{path}: {exc.error_count()} invalid field(s)"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = dotted(loc)
        line = locate(text, loc)
        where = f"{path}:{line}" if line else str(path)
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {field or '(top level)'}: {msg}")
    return "\n".join(lines)


def locate(text: str, loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line number (1-based) of a pydantic `loc` path in a TOML text."""
    rows = text.splitlines()
    start, end = 0, len(rows)
    keys = [p for p in loc if isinstance(p, str)]
    table = ""  # set once the table's header line is found
    if loc and isinstance(loc[0], str):
        name, index = loc[0], (loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None)
        headers = [i for i, r in enumerate(rows) if re.match(rf"^\s*\[\[?\s*{re.escape(name)}\s*\]\]?", r)]
        if headers:
            table = name
            pick = headers[index] if index is not None and index < len(headers) else headers[0]
            start = pick
            nxt = [i for i, r in enumerate(rows) if i > pick and re.match(r"^\s*\[", r)]
            end = nxt[0] if nxt else len(rows)
            keys = keys[1:]
            if not keys:
                return pick + 1
    for key in reversed(keys):
        for i in range(start, end):
            if re.match(rf'^\s*"?{re.escape(key)}"?\s*=', rows[i]) or re.search(
                rf'[{{,]\s*"?{re.escape(key)}"?\s*=', rows[i]
            ):
                return i + 1
    if table and keys:  # a field written as its own sub-table: `[engine.args]`
        header = rf"^\s*\[\s*{re.escape(table)}\.{re.escape(keys[0])}\s*\]"
        sub = [i for i, r in enumerate(rows) if re.match(header, r)]
        if sub:
            return sub[0] + 1
    return start + 1 if table else None
