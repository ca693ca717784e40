"""`fleetgen hosts check`: what each host of a fleet has, probed over SSH in parallel.

Per host: reachable (else the connect error and its fix), then `up`'s own survey (`deploy.hostsurvey`, one
round trip): OS, GPUs (nvidia-smi when present), host RAM, free disk in the workdir, whether the engine's
python runs and which engine version it imports, whether the model folder exists. Every shortfall is a
`problems` line saying the cause and the fix; nothing here raises for one bad host: the report says what is
wrong with each.

What `up` would refuse is said in `up`'s words: a host it calls ready is one `up` launches on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from fleetgen.config import EngineConfig, FleetFile, HostEntry
from fleetgen.deploy.hostsurvey import (
    INSTALL_FIX,
    GpuInfo,
    HostSurvey,
    install_release,
    launch_problems,
    not_installed,
    other_release,
    survey_host,
)
from fleetgen.errors import RemoteError
from fleetgen.remote import Host, open_host


@dataclass(frozen=True)
class HostReport:
    """What one host has. `error`/`fix` when unreachable; `problems` lists other shortfalls (cause; fix)."""

    host: str
    reachable: bool
    error: str | None = None
    fix: str | None = None
    os: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    mem_total_gib: float | None = None
    mem_available_gib: float | None = None
    disk_free_gib: float | None = None
    python: str = ""
    python_ok: bool = False
    python_version: str | None = None
    engine: str = ""
    engine_version: str | None = None
    model: str = ""
    model_present: bool = False
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def is_ready(self) -> bool:
        """Reachable and nothing missing: the host can run the engine."""
        return self.reachable and not self.problems


async def check_hosts(fleet_file: FleetFile) -> list[HostReport]:
    """Probe every host of `fleet_file` at once; one report per host, in the fleet file's order."""
    return list(await asyncio.gather(*(check_host(fleet_file.engine, entry) for entry in fleet_file.hosts)))


async def check_host(engine: EngineConfig, entry: HostEntry) -> HostReport:
    """Probe one host. Never raises for the host's own trouble: the report carries it."""
    host = open_host(entry)
    report = HostReport(entry.name, False, python=engine.python, engine=engine.kind, model=engine.model)
    try:
        async with host:
            report = await _probe(host, engine, entry, report)
    except RemoteError as exc:  # unreachable, host key, or the connection died mid-probe
        report = replace(report, error=exc.message, fix=exc.fix or None)
    return replace(report, warnings=tuple(host.warnings))


async def _probe(host: Host, engine: EngineConfig, entry: HostEntry, report: HostReport) -> HostReport:
    survey = await survey_host(host, entry, engine)
    python = survey.python_version or None
    problems = [f"{p.message}; {p.fix}" for p in launch_problems(survey, entry, engine)]
    problems += _version_problems(engine, entry, survey)
    if not survey.workdir:
        problems.append(
            f"cannot create the workdir {entry.workdir} on {entry.name}; set hosts.workdir to a folder the "
            "SSH user can write"
        )
    if survey.gpu_error:
        problems.append(
            f"nvidia-smi fails on {host.name}: {survey.gpu_error}; check the driver (run nvidia-smi there)"
        )
    found = [gpu.index for gpu in survey.gpu_rows]
    missing = sorted(set(entry.gpus) - set(found)) if found and entry.gpus != "all" else []
    if missing:
        problems.append(
            f"GPU(s) {missing} listed for {entry.name} do not exist there (found {found}); "
            "fix `gpus` in its [[hosts]] entry"
        )
    return replace(
        report,
        reachable=True,
        os=survey.os or None,
        gpus=survey.gpu_rows,
        mem_total_gib=_gib(survey.mem_total_bytes),
        mem_available_gib=_gib(survey.mem_available_bytes),
        disk_free_gib=_gib(survey.disk_free_bytes),
        python_ok=python is not None,
        python_version=python,
        engine_version=survey.engine_version,
        model_present=survey.has_model,
        problems=tuple(problems),
    )


def _gib(size: int | None) -> float | None:
    return round(size / 1024**3, 2) if size is not None else None


def _version_problems(engine: EngineConfig, entry: HostEntry, survey: HostSurvey) -> list[str]:
    """The engine's release on the host: none found (a launcher that imports, but no engine distribution), or
    another than the fleet file's `engine.version`. A python that does not run, or a launcher that does not
    import, is a launch problem already."""
    version = survey.engine_version
    if not survey.python_version or survey.module_missing:
        return []
    if version is None:
        return [f"{entry.name}: {not_installed(engine)}; {INSTALL_FIX}"]
    if engine.version and not version.startswith(engine.version):
        differs = other_release(entry.name, engine, version, engine.version, "the fleet file")
        return [
            f"{differs}; {install_release(engine, engine.version)} or update engine.version (plan and up "
            f"decide flags by the {version} the host runs)"
        ]
    return []
