"""The files users write: the fleet file (TOML) and the job file (TOML).

Models are frozen and strict (`extra="forbid"`): a typo is an error naming the file, the line and the field,
never a silently ignored key. Derived values (instances, ports) are properties, not stored state.
Pure: `load_fleet` / `load_job` read one file; nothing here touches a host.

Imports elsewhere name `fleetgen.config` only, never its modules.
"""

from __future__ import annotations

from fleetgen.config.cluster import CLUSTER_KINDS, ClusterConfig
from fleetgen.config.common import locate
from fleetgen.config.engine import ENGINE_KINDS, LOOPBACK, ArgValue, EngineConfig, register_engine_kind
from fleetgen.config.fleet import FleetFile, Instance, Selection, load_fleet
from fleetgen.config.hosts import HostEntry
from fleetgen.config.job import JobFile, load_job
from fleetgen.config.ray import RayCluster
from fleetgen.config.slurm import SlurmCluster

__all__ = [
    "CLUSTER_KINDS",
    "ENGINE_KINDS",
    "LOOPBACK",
    "ArgValue",
    "ClusterConfig",
    "EngineConfig",
    "FleetFile",
    "HostEntry",
    "Instance",
    "JobFile",
    "RayCluster",
    "Selection",
    "SlurmCluster",
    "load_fleet",
    "load_job",
    "locate",
    "register_engine_kind",
]
