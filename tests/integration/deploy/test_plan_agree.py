"""`plan` and `up` decide an instance's argv in ONE place, so what `plan` checked is what `up` runs.

Over REAL sshd, with `fleetgen.sim` as the engine: the host's engine python sees the REAL SGLang 0.5.23
install (FLEETGEN_SGLANG_PYTHON's, scripts/install-sglang-parser.sh: skipped locally, a failure in CI when
missing) besides this project's packages, while the fleet file says engine.version = "0.5.10", whose flag
names differ (`cuda-graph-max-bs` and `mamba-scheduler-strategy` before 0.5.14). The argv `plan --json`
prints must be, byte for byte, the argv `up` launches (read back from /proc), and the state records the
version and rule set `up` used. (`up` used to take engine.version: it launched the 0.5.10 names, which the
host's 0.5.23 parser refuses.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.deploy.state import load_state
from tests.fixtures.sglang import real_sglang_python
from tests.fixtures.sshd import SshdHost
from tests.integration.deploy.test_sglang import FLEETGEN, QWEN36, sim_fleet


def python_with_real_sglang(root: Path) -> str:
    """A venv whose python imports fleetgen (for `fleetgen.sim`) and, after it, the real SGLang install's
    site-packages: the version probe reads SGLang's own dist-info (this project's packages come first, so
    the sim runs on the versions it was tested with)."""
    real = Path(real_sglang_python())
    code = """
import importlib.metadata, sysconfig
print(importlib.metadata.version("sglang"), sysconfig.get_paths()["purelib"])
"""
    version, theirs = subprocess.run(
        [real, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert version == "0.5.23", f"{real} has SGLang {version}: run scripts/install-sglang-parser.sh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    [site] = root.glob("lib/python*/site-packages")
    ours = sysconfig.get_paths()["purelib"]  # this venv's site-packages (fleetgen is installed there)
    (site / "fleetgen-test.pth").write_text(
        f"import site; site.addsitedir({ours!r}); site.addsitedir({theirs!r})\n"
    )
    return str(root / "bin" / "python")


async def test_plan_json_argv_is_byte_for_byte_what_up_launches(
    ssh_hosts: list[SshdHost], tmp_path: Path
) -> None:
    python = python_with_real_sglang(tmp_path / "py")
    fleet = sim_fleet(
        tmp_path, ssh_hosts[:1], python=python, model=QWEN36, args={"cuda-graph-max-bs-decode": 8}
    )
    text = fleet.read_text().replace("[engine]\n", '[engine]\nversion = "0.5.10"\n', 1)
    fleet.write_text(text)
    planned = await asyncio.to_thread(
        subprocess.run,
        [FLEETGEN, "plan", "--json", "-f", str(fleet)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert planned.stdout, planned.stderr
    [plan] = json.loads(planned.stdout)["instances"]
    assert plan["rules"] == "sglang-0.5.23"
    assert "--cuda-graph-max-bs-decode" in plan["argv"] and "--mamba-radix-cache-strategy" in plan["argv"]
    try:
        [out] = await up(Fleet.load(fleet))
        assert out.error is None, out.error
        assert out.pid is not None
        launched = (await asyncio.to_thread(Path(f"/proc/{out.pid}/cmdline").read_bytes)).split(b"\0")[:-1]
        assert launched == [arg.encode() for arg in plan["argv"]]
        record = load_state(fleet)[out.instance]
        assert (record.engine_version, record.rule_set) == ("0.5.23", "sglang-0.5.23")
    finally:
        await down(Fleet.load(fleet))
