"""The host survey: workdir, interpreter, engine version, model folder, GPUs, memory and disk, in one round
trip. `hosts check`, `plan` and `up` read a host through this one survey, so `up` decides argv and checks the
fleet from what `plan` measures; `launch_problems` lists what stops the engine from starting there.

The check is one POSIX sh snippet (`PREP_SH`) run with its values as positional arguments (never pasted into
the text), answering in `key=value` lines; the failures become errors naming the host, the cause and the fix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fleetgen.config import EngineConfig, HostEntry
from fleetgen.deploy.modelshape import is_path_like
from fleetgen.engines import get_engine, launcher_of
from fleetgen.errors import DeployError, LaunchFailed
from fleetgen.plan.types import MIB, GpuFacts
from fleetgen.remote.base import Host
from fleetgen.remote.scripts import sh

# Prints the version of the first of argv's distributions installed; exit 3 when none is.
VERSION_PY = """\
import importlib.metadata as m, sys
for name in sys.argv[1:]:
    try:
        print(m.version(name))
        break
    except m.PackageNotFoundError:
        pass
else:
    sys.exit(3)
"""

# $1 python, $2 top-level launcher module ("" when the launcher is not `-m`), $3 model path ("" = not a path),
# $4 workdir, $5 VERSION_PY, $6… the engine's distributions. `~` is expanded against the login's $HOME; the
# resolved workdir is printed first, then the free disk there (of its nearest existing folder when it cannot
# be made), then what `HostSurvey` holds.
PREP_SH = r"""
python=$1 module=$2 model=$3 workdir=$4 version_py=$5
shift 5
case $workdir in "~") workdir=$HOME ;; "~/"*) workdir="$HOME/${workdir#"~/"}" ;; esac
case $model in "~/"*) model="$HOME/${model#"~/"}" ;; esac
d=$workdir
mkdir -p -- "$workdir" && cd -- "$workdir" && echo "workdir=$(pwd -P)" && d=. || echo "workdir="
while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
echo "disk_free_kib=$(df -Pk -- "$d" | awk 'NR==2 {print $4}')"
os=$(. /etc/os-release 2>/dev/null; printf '%s' "${PRETTY_NAME:-$(uname -s)}")
echo "os=$os (kernel $(uname -r))"
if version=$("$python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null); then
  echo "python=$version"
  if [ -n "$module" ]; then
    "$python" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)' \
      "$module" >/dev/null 2>&1 && echo "module=ok" || echo "module=missing"
  fi
  echo "engine_version=$("$python" -c "$version_py" "$@" 2>/dev/null | head -n 1)"
fi
if [ -z "$model" ] || [ -d "$model" ]; then echo "model=ok"; else echo "model=missing"; fi
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "nvidia_smi=yes"
  if gpus=$(nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader,nounits 2>&1)
  then printf '%s\n' "$gpus" | sed 's/^/gpu_mib=/'
  else echo "nvidia_smi_error=$(printf '%s\n' "$gpus" | tail -n 1)"; fi
else echo "nvidia_smi=no"; fi
awk '$1 == "MemTotal:" { print "mem_total_kib=" $2 }
  $1 == "MemAvailable:" { print "mem_available_kib=" $2 }' /proc/meminfo
echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "clk_tck=$(getconf CLK_TCK)"
"""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi reports it (MiB)."""

    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int

    def facts(self) -> GpuFacts:
        """As planning counts it: bytes, free = total - used, measured."""
        total, used = self.memory_total_mib, self.memory_used_mib
        return GpuFacts(self.index, total * MIB, (total - used) * MIB, measured=True)


@dataclass
class HostSurvey:
    """What the prep snippet found on a host."""

    workdir: str  # "" when it cannot be created
    has_nvidia_smi: bool
    uptime_s: float
    clk_tck: int
    measured_at: float = field(default_factory=time.monotonic)
    engine_version: str | None = None  # what the engine's python imports; None: not installed / unknown
    mem_available_bytes: int | None = None
    gpu_rows: tuple[GpuInfo, ...] = ()  # nvidia-smi's GPUs, when it answered
    gpu_error: str = ""  # nvidia-smi's last words when it failed
    mem_total_bytes: int | None = None
    disk_free_bytes: int | None = None
    os: str = ""
    python_version: str = ""  # "" when the engine's python does not run
    module_missing: bool = False  # the python cannot import the launcher's module
    has_model: bool = True  # the model folder exists (a hub id is not checked)

    @property
    def gpus(self) -> tuple[GpuFacts, ...]:
        """The GPUs as planning counts them: total and free memory, measured."""
        return tuple(gpu.facts() for gpu in self.gpu_rows)

    def uptime_of(self, start_time: int) -> float:
        """Seconds a process with this /proc start time (clock ticks since boot) has been running."""
        now = self.uptime_s + (time.monotonic() - self.measured_at)
        return max(0.0, now - start_time / self.clk_tck)


def launcher_module(launcher: tuple[str, ...]) -> str:
    """The top-level package of `-m pkg.mod` (what must be importable), or "" for another launcher."""
    if len(launcher) >= 2 and launcher[0] == "-m":
        return launcher[1].split(".", 1)[0]
    return ""


async def survey_host(host: Host, entry: HostEntry, cfg: EngineConfig) -> HostSurvey:
    """Make and resolve the workdir and read what the host has for the engine, in one round trip."""
    model_arg = cfg.model if is_path_like(cfg.model) else ""
    dists = get_engine(cfg.kind).distributions
    module = launcher_module(launcher_of(cfg))
    res = await host.run(sh(PREP_SH, cfg.python, module, model_arg, entry.workdir, VERSION_PY, *dists))
    return survey_from_prep(res.stdout)


def survey_from_prep(stdout: str) -> HostSurvey:
    """What PREP_SH printed (`key=value` lines; `gpu_mib=INDEX,NAME,TOTAL,USED` per GPU)."""
    kv = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)

    def kib(key: str) -> int | None:
        return int(kv[key]) * 1024 if kv.get(key, "").isdigit() else None

    gpu_lines = [line.removeprefix("gpu_mib=") for line in stdout.splitlines() if line.startswith("gpu_mib=")]
    return HostSurvey(
        workdir=kv.get("workdir", ""),
        has_nvidia_smi=kv.get("nvidia_smi") == "yes",
        uptime_s=float(kv.get("uptime") or 0),
        clk_tck=int(kv.get("clk_tck") or 100),
        engine_version=kv.get("engine_version") or None,
        mem_available_bytes=kib("mem_available_kib"),
        gpu_rows=tuple(parse_gpu_csv("\n".join(gpu_lines))),
        gpu_error=kv.get("nvidia_smi_error", ""),
        mem_total_bytes=kib("mem_total_kib"),
        disk_free_bytes=kib("disk_free_kib"),
        os=kv.get("os", ""),
        python_version=kv.get("python", ""),
        module_missing=kv.get("module") == "missing",
        has_model=kv.get("model") == "ok",
    )


async def prepare_host(
    host: Host, entry: HostEntry, cfg: EngineConfig, *, check_launch: bool = True
) -> HostSurvey:
    """The host surveyed, its workdir made; with `check_launch`, the first of `launch_problems` raised.
    `check_launch=False` (for `down`, `status`, `logs`) only reports: a broken python must not stop `down`."""
    survey = await survey_host(host, entry, cfg)
    if not survey.workdir:
        raise DeployError(
            f"{entry.name}: cannot create the workdir {entry.workdir}",
            context={"host": entry.name},
            fix="set hosts.workdir to a folder the SSH user can write",
        )
    problems = launch_problems(survey, entry, cfg) if check_launch else []
    if problems:
        raise problems[0]
    return survey


INSTALL_FIX = "pip install the engine into that python, or point engine.python at the venv that has it"


def not_installed(cfg: EngineConfig) -> str:
    """No distribution of the engine for its python (what the version probe reads)."""
    return (
        f"{cfg.kind} is not installed for {cfg.python} (no {' or '.join(get_engine(cfg.kind).distributions)})"
    )


def other_release(where: str, cfg: EngineConfig, found: str | None, expected: str, by: str) -> str:
    """A host or node that runs another release of the engine than `by` (the fleet file, the plan) expects,
    in the words `hosts check` and Ray's `up` both use."""
    return f"{where} has {cfg.kind} {found or '(none installed)'}, {by} expects {expected}"


def install_release(cfg: EngineConfig, version: str) -> str:
    """The fix for `other_release`: that release installed where it differs."""
    return f"install {cfg.kind}=={version} there"


def launch_problems(survey: HostSurvey, entry: HostEntry, cfg: EngineConfig) -> list[LaunchFailed]:
    """What stops the engine from starting on this host, each with its fix: its python does not run, its
    launcher module does not import, its model folder is missing. `up` raises the first; `hosts check` lists
    them all, so a host it calls ready is one `up` launches on."""
    ctx = {"host": entry.name}
    if not survey.python_version:
        return [
            LaunchFailed(
                f"{entry.name}: the engine's python {cfg.python!r} does not run on the host",
                context=ctx,
                fix="set engine.python to the interpreter of the engine's venv "
                "on the host (an absolute path such as /opt/venv/bin/python)",
            )
        ]
    problems = []
    if survey.module_missing:
        launcher = launcher_of(cfg)
        mod = launcher_module(launcher)
        why = f"{cfg.python} cannot import {mod!r} (the launcher {' '.join(launcher)})"
        if survey.engine_version is None:
            why = f"{not_installed(cfg)}: {why}"
        problems.append(
            LaunchFailed(f"{entry.name}: {why}", context=ctx, fix=f"{INSTALL_FIX} (or fix engine.launcher)")
        )
    if not survey.has_model:
        problems.append(
            LaunchFailed(
                f"{entry.name}: the model folder {cfg.model} does not exist on the host",
                context=ctx,
                fix="copy the model there (e.g. huggingface-cli download … --local-dir), or set engine.model "
                "to the folder that holds it",
            )
        )
    return problems


# nvidia-smi's GPUs as `parse_gpu_csv` reads them (PREP_SH asks the same).
GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"]


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """nvidia-smi `index,name,memory.total,memory.used` CSV (noheader, nounits; the name may be left out)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        index, total, used = parts[0], parts[-2], parts[-1]
        name = ",".join(parts[1:-2])  # a GPU name could hold a comma; the numbers are the last two fields
        try:
            gpus.append(GpuInfo(int(index), name, int(float(total)), int(float(used))))
        except ValueError:
            continue  # "[N/A]" fields (e.g. MIG): skip the row rather than invent numbers
    return gpus
