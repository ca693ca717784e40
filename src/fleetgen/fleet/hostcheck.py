"""`fleetgen hosts check`: what each host of a fleet has, probed over SSH in parallel.

Per host: reachable (else the connect error and its fix), OS, GPUs (nvidia-smi when present), host RAM,
free disk in the workdir, whether the engine's python runs and which engine version it imports, whether
the model folder exists. Every shortfall is a `problems` line saying the cause and the fix; nothing here
raises for one bad host: the report says what is wrong with each.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fleetgen.config import EngineConfig, FleetFile, HostEntry
from fleetgen.deploy.hostside import VERSION_PY, GpuInfo, parse_gpu_csv
from fleetgen.engines import get_engine
from fleetgen.errors import CommandError, RemoteError
from fleetgen.remote import Host, open_host, scripts

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
_EXIT_NO_NVIDIA_SMI = 69
_GPU_SH = 'command -v nvidia-smi >/dev/null 2>&1 || exit 69; exec "$@"'
_OS_SH = '. /etc/os-release 2>/dev/null; printf "%s (kernel %s)" "${PRETTY_NAME:-$(uname -s)}" "$(uname -r)"'
_PROBE_TIMEOUT_S = 60.0
_KIB_PER_GIB = 1024**2


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
    warnings: tuple[str, ...] = field(default=())

    @property
    def is_ready(self) -> bool:
        """Reachable and nothing missing: the host can run the engine."""
        return self.reachable and not self.problems


async def check_hosts(fleet: FleetFile) -> list[HostReport]:
    """Probe every host of `fleet` at once; one report per host, in the fleet file's order."""
    return list(await asyncio.gather(*(check_host(fleet.engine, entry) for entry in fleet.hosts)))


async def check_host(engine: EngineConfig, entry: HostEntry) -> HostReport:
    """Probe one host. Never raises for the host's own trouble: the report carries it."""
    host = open_host(entry)
    try:
        async with host:
            return await _probe(host, engine, entry)
    except RemoteError as exc:  # unreachable, host key, or the connection died mid-probe
        return HostReport(
            host=entry.name,
            reachable=False,
            error=exc.message,
            fix=exc.fix or None,
            python=engine.python,
            engine=engine.kind,
            model=engine.model,
            warnings=tuple(host.warnings),
        )


async def _probe(host: Host, engine: EngineConfig, entry: HostEntry) -> HostReport:
    problems: list[str] = []
    (os_name, gpus, mem), (disk, python, version, model_present) = await asyncio.gather(
        asyncio.gather(_os(host), _gpus(host, problems), _meminfo(host)),
        asyncio.gather(
            _disk_free_gib(host, entry.workdir),
            _python_says(host, [engine.python, "-c", "import sys; print(sys.version.split()[0])"]),
            _python_says(host, [engine.python, "-c", VERSION_PY, *get_engine(engine.kind).distributions]),
            host.exists(engine.model),
        ),
    )
    problems += _software_problems(engine, entry, python, version)
    problems += _gpu_problems(entry, gpus)
    if not model_present:
        problems.append(
            f"model folder {engine.model} is missing on {entry.name}; copy the model there "
            "(e.g. huggingface-cli download … --local-dir) or fix engine.model"
        )
    return HostReport(
        host=entry.name,
        reachable=True,
        os=os_name,
        gpus=tuple(gpus),
        mem_total_gib=mem[0],
        mem_available_gib=mem[1],
        disk_free_gib=disk,
        python=engine.python,
        python_ok=python is not None,
        python_version=python,
        engine=engine.kind,
        engine_version=version,
        model=engine.model,
        model_present=model_present,
        problems=tuple(problems),
        warnings=tuple(host.warnings),
    )


def _software_problems(
    engine: EngineConfig, entry: HostEntry, python: str | None, version: str | None
) -> list[str]:
    if python is None:
        return [
            f"engine python `{engine.python}` does not run on {entry.name}; install it there or set "
            "engine.python to its full path (e.g. /opt/venv/bin/python)"
        ]
    if version is None:
        dists = " or ".join(get_engine(engine.kind).distributions)
        return [
            f"{engine.kind} is not installed for {engine.python} on {entry.name} (no {dists} "
            "distribution); pip install it into that python, or point engine.python at the venv that has it"
        ]
    if engine.version and not version.startswith(engine.version):
        return [
            f"{entry.name} has {engine.kind} {version}, the fleet file expects {engine.version}; install "
            f"{engine.kind}=={engine.version} there or update engine.version (plan and up decide flags by "
            f"the {version} the host runs)"
        ]
    return []


def _gpu_problems(entry: HostEntry, gpus: list[GpuInfo]) -> list[str]:
    if not gpus or entry.gpus == "all":
        return []
    missing = sorted(set(entry.gpus) - {gpu.index for gpu in gpus})
    if not missing:
        return []
    return [
        f"GPU(s) {missing} listed for {entry.name} do not exist there (found {[g.index for g in gpus]}); "
        "fix `gpus` in its [[hosts]] entry"
    ]


async def _os(host: Host) -> str | None:
    result = await host.run(scripts.sh(_OS_SH), check=False, timeout=_PROBE_TIMEOUT_S)
    return result.stdout.strip() or None


async def _gpus(host: Host, problems: list[str]) -> list[GpuInfo]:
    result = await host.run(scripts.sh(_GPU_SH, *GPU_QUERY), check=False, timeout=_PROBE_TIMEOUT_S)
    if result.exit_status == _EXIT_NO_NVIDIA_SMI:
        return []  # no NVIDIA driver tools: a CPU host (fine for vllm-cpu; the plan says whether it fits)
    if result.exit_status != 0:
        cause = (
            result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.exit_status}"
        )
        problems.append(f"nvidia-smi fails on {host.name}: {cause}; check the driver (run nvidia-smi there)")
        return []
    return parse_gpu_csv(result.stdout)


async def _meminfo(host: Host) -> tuple[float | None, float | None]:
    result = await host.run(["cat", "/proc/meminfo"], check=False, timeout=_PROBE_TIMEOUT_S)
    values: dict[str, float] = {}
    for line in result.stdout.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key] = round(int(fields[0]) / _KIB_PER_GIB, 2)
    return values.get("MemTotal"), values.get("MemAvailable")


async def _disk_free_gib(host: Host, workdir: str) -> float | None:
    folder = await host.expand(workdir)
    result = await host.run(scripts.sh(scripts.DISK_FREE_SH, folder), check=False, timeout=_PROBE_TIMEOUT_S)
    text = result.stdout.strip()
    return round(int(text) / _KIB_PER_GIB, 2) if text.isdigit() else None


async def _python_says(host: Host, argv: list[str]) -> str | None:
    """What a python one-liner printed; None when it failed or hung (no such python, engine not installed)."""
    try:
        result = await host.run(argv, check=False, timeout=_PROBE_TIMEOUT_S)
    except CommandError:  # timed out
        return None
    return (result.stdout.strip() or None) if result.exit_status == 0 else None
