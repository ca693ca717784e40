"""What a Ray fleet's servers are launched by: the survey of the nodes Ray may place them on, not of the
driver (pure; `deploy.placement.ray` reads the nodes, one Ray task each).

A server's argv is decided (`plan.decide_launch`, by the engine version) and its paths rendered (by the
resolved workdir) before Ray picks its node, so every node it may be placed on must agree on both: `up`
decides by what they run (the fleet file's `engine.version` where one runs it, else the newest, as `plan`
picks among hosts) and refuses, before any actor starts, a node that runs another release, in the words
`hosts check` uses for a host (`hostsurvey.other_release`). The driver's GPUs, RAM and engine are none of
the servers': planning takes the cluster's GPUs from the fleet file (`gpu_memory_gib`, as `plan` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from fleetgen.config import EngineConfig
from fleetgen.deploy.hostsurvey import HostSurvey, install_release, other_release
from fleetgen.engines.rules import reported_releases
from fleetgen.errors import LaunchFailed
from fleetgen.remote.ray import RayNode

# where a node of another release may be left out: a server may be placed on any live node the labels pick
OFF_THE_NODE = "keep servers off that node with cluster.labels (a server may be placed on any live node with "
OFF_THE_NODE += "the cluster's labels and engine.tp GPUs)"


def before_placing(refused: Sequence[LaunchFailed]) -> LaunchFailed:
    """The nodes' refusals (each naming its node) as one error: raised before anything is placed."""
    return LaunchFailed(
        "; ".join(r.message for r in refused) + " (checked before anything was placed)",
        context={"nodes": ", ".join(str(r.context["node"]) for r in refused)},
        fix="; ".join(dict.fromkeys(r.fix for r in refused)),
    )


def launch_version(cfg: EngineConfig, found: Iterable[str | None]) -> str | None:
    """The engine version every server's flags are decided for, of those the nodes run: the newest that
    `engine.version` names (a prefix, as `hosts check` reads it), else the newest; None: none read one."""
    versions = reported_releases(found)
    named = [v for v in versions if cfg.version and v.startswith(cfg.version)]
    chosen = named or versions
    return chosen[-1] if chosen else None


def version_refusal(
    cfg: EngineConfig, node: RayNode, found: str | None, expected: str | None
) -> LaunchFailed | None:
    """`node` runs another engine release (`found`) than the servers' flags were decided for (`expected`;
    None: none known, nothing to refuse); a prefix `expected` (`engine.version = "0.5"`) covers its
    releases, as `hosts check` reads it."""
    if expected is None or found == expected or (found or "").startswith(expected):
        return None
    differs = other_release(node.label, cfg, found, expected, "the plan")
    return LaunchFailed(
        f"Ray {differs} (every server's flags are decided for it before Ray picks a node)",
        context={"node": node.label},
        fix=f"{install_release(cfg, expected)}, or {OFF_THE_NODE}",
    )


def launch_survey(
    cfg: EngineConfig, login: HostSurvey, surveyed: Sequence[tuple[RayNode, HostSurvey]]
) -> HostSurvey:
    """The one survey every server is launched by: the nodes' engine version (`launch_version`) and
    resolved workdir over the driver's; none of the driver's GPUs or RAM (the fleet file's stand for the
    cluster's). Raises naming each node that runs another release, or resolves the workdir elsewhere."""
    version = launch_version(cfg, (s.engine_version for _, s in surveyed))
    refused = [r for n, s in surveyed if (r := version_refusal(cfg, n, s.engine_version, version))]
    workdirs = {s.workdir for _, s in surveyed}
    if len(workdirs) > 1:
        where = "; ".join(f"{n.label}: {s.workdir}" for n, s in surveyed)
        refused.append(
            LaunchFailed(
                f"the Ray nodes resolve the cluster's workdir to different folders ({where})",
                context={"node": ", ".join(n.label for n, _ in surveyed)},
                fix="set cluster.workdir to an absolute path (not under ~): a server's paths are rendered "
                "before Ray picks its node",
            )
        )
    if refused:
        raise before_placing(refused)
    first = surveyed[0][1] if surveyed else login
    return replace(
        login,
        workdir=first.workdir,
        engine_version=version,
        python_version=first.python_version,
        has_nvidia_smi=False,
        gpu_rows=(),
        gpu_error="",
        mem_available_bytes=None,
        mem_total_bytes=None,
        disk_free_bytes=first.disk_free_bytes,
    )
