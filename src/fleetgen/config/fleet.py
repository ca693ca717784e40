"""The fleet file: `[engine]` + `[[hosts]]` or `[cluster]`, instance expansion (`<host>-<k>`), and what
`--only` selects (`Selection`). Derived values (instances, ports) are computed, not stored state.

Refused, each at its line: a repeated host name, a host named like another's instance, an empty GPU list,
a GPU count `tp` does not divide. `Selection` maps instance → host from the expansion, never by prefix.
`engine_for(host)` is the one place a host's `engine_args` merge over `[engine.args]` (`plan` and `up` both
take it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from fleetgen.config.cluster import CLUSTER_KINDS, ClusterConfig
from fleetgen.config.common import Strict, dotted, load_toml, locate
from fleetgen.config.engine import EngineConfig
from fleetgen.config.hosts import HostEntry
from fleetgen.errors import ConfigError


class Instance(Strict):
    """One engine server: `tp` GPUs of one host, one port. Derived from the fleet file, never written."""

    name: str
    host: str
    gpus: tuple[int, ...]
    port: int
    index: int


_CLUSTER: TypeAdapter[ClusterConfig] = TypeAdapter(ClusterConfig)


class FleetFile(Strict):
    """A whole fleet file."""

    engine: EngineConfig
    hosts: list[HostEntry] = Field(default_factory=list)
    cluster: ClusterConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_placement(cls, data: Any) -> Any:
        """`[[hosts]]` (SSH hosts) or `[cluster]` (Slurm, Ray), exactly one; a valid cluster stands as one
        host, its submit host (Ray's: this machine, the driver), so everything that walks `hosts` (plan,
        select, status) sees the same fleet."""
        if not isinstance(data, dict):
            return data
        has_hosts, has_cluster = bool(data.get("hosts")), "cluster" in data
        if has_hosts and has_cluster:
            raise ValueError(
                "the fleet file has both [[hosts]] and [cluster]: a fleet is placed on SSH hosts or by a "
                "cluster (Slurm, Ray), not both; keep one (two fleet files for two placements)"
            )
        if not has_hosts and not has_cluster:
            raise ValueError(
                "no [[hosts]] and no [cluster]: add [[hosts]] entries (SSH hosts) or a [cluster] table "
                f"(kind = {' or '.join(map(repr, CLUSTER_KINDS))}); `fleetgen init` writes an example"
            )
        if has_cluster:
            try:
                cluster = _CLUSTER.validate_python(data["cluster"])
            except ValidationError:
                return data  # reported by the field's own validation, with its location
            return {**data, "hosts": [cluster.submit_host()]}
        return data

    @model_validator(mode="after")
    def _layout(self) -> FleetFile:
        """Host names once each, GPU lists `tp` divides, no host named like another's instance (`gpu-1`)."""
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

    @property
    def placement_kind(self) -> str:
        """What places the servers: "hosts" (`[[hosts]]`, over SSH) or the `[cluster]`'s kind; the key of
        the placement registry (`deploy.placement`)."""
        return self.cluster.kind if self.cluster else "hosts"

    @property
    def assigns_devices(self) -> bool:
        """Whether the placement hands each server its GPUs (and sets CUDA_VISIBLE_DEVICES) itself: then
        the launch exports none of its own (the fleet's GPU indices are slots, not devices)."""
        return bool(self.cluster and self.cluster.assigns_devices)

    def host(self, name: str) -> HostEntry:
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(
            f"no host named {name!r}", fix=f"use one of: {', '.join(h.name for h in self.hosts)}"
        )

    def engine_for(self, host: str) -> EngineConfig:
        """The engine section one host's instances run: `[engine]` with the host's `engine_args` over
        `[engine.args]` (the one place they merge: `plan` sizes and `up` launches what it returns)."""
        extra = self.host(host).engine_args
        if not extra:
            return self.engine
        return self.engine.model_copy(update={"args": {**self.engine.args, **extra}})

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
            why, fix = _gpu_count_problem(gpus, tp, f'gpus = "all" found {gpus} on {host.name}')
            if why:
                where = self.where(source, ("hosts", self.hosts.index(host), "gpus"))
                raise ConfigError(f"{where}: {why}", fix=fix, context={"host": host.name})
        base = host.base_port if host.base_port is not None else self.engine.base_port
        return [
            Instance(
                name=f"{host.name}-{k}",  # unique in a fleet: host names are, and `-k` is last
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


@dataclass(frozen=True)
class Selection:
    """What `--only` picks, host by host: None = every instance of that host, else these instance names."""

    picks: Mapping[str, frozenset[str] | None]

    def hosts(self, fleet_file: FleetFile) -> list[HostEntry]:
        return [h for h in fleet_file.hosts if h.name in self.picks]

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


def layout_problems(fleet_file: FleetFile) -> list[tuple[tuple[int | str, ...], str]]:
    """(field location, why + fix) for GPU lists `tp` does not divide and names two things could share."""
    tp = fleet_file.engine.tp
    if fleet_file.cluster:  # a cluster checks its own table (its submit host's GPU list is its slots)
        return fleet_file.cluster.problems(tp)
    names = [h.name for h in fleet_file.hosts]
    problems: list[tuple[tuple[int | str, ...], str]] = [
        (("hosts", j, "name"), f"host names repeat: {name}; every [[hosts]] needs its own name")
        for j, name in enumerate(names)
        if names.index(name) != j
    ]
    for i, host in enumerate(fleet_file.hosts):
        if host.gpus != "all":
            why, fix = _gpu_count_problem(host.gpus, tp, f"gpus = {host.gpus}")
            if why:
                problems.append((("hosts", i, "gpus"), f"{why}; {fix}"))
    for j, other in enumerate(fleet_file.hosts):
        for host in fleet_file.hosts:
            clash = _name_clash(fleet_file, host, other.name)
            if clash:
                problems.append((("hosts", j, "name"), clash))
    return problems


def _name_clash(fleet_file: FleetFile, host: HostEntry, name: str) -> str:
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
    if name in {i.name for i in fleet_file.instances_on(host)}:
        return (
            f"host {name!r} has the name of instance {match.group(1)} of host {host.name!r} (instances are "
            f"named <host>-<k>): --only, logs and down could not tell them apart; {rename}"
        )
    return ""


def _gpu_count_problem(gpus: list[int], tp: int, what: str) -> tuple[str, str]:
    """Why `tp` leaves some of `gpus` unused (or there are none), and the fix; empty when it does not."""
    if not gpus:
        return f"{what}: no GPU, so no instance", "list the GPUs to use, or remove this host"
    usable, unused = gpus[: len(gpus) // tp * tp], gpus[len(gpus) // tp * tp :]
    if not unused:
        return "", ""
    why = (
        f"{what} with engine.tp = {tp} leaves GPU {', '.join(map(str, unused))} unused "
        f"({len(gpus) // tp} instance(s) of {tp} GPUs)"
    )
    if usable:
        return why, f"list a multiple of {tp} GPUs (gpus = {usable}) or change engine.tp"
    return why, f"list at least {tp} GPUs for this host or remove it (engine.tp is for every host)"


def load_fleet(path: Path) -> FleetFile:
    """Read and validate a fleet file; errors name the file, line and field."""
    return load_toml(path, FleetFile, "fleet file")
