"""A failed start names its root cause: the real engines' captured logs replayed by a real process.

The engines cannot start here (no GPU), so a real detached process writes what the real engine wrote
before it died (tests/data/real-engines/) and exits; fleetgen's ready wait (deploy.readywait) reads that log
as an engine's.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import aiohttp
import pytest

from fleetgen.deploy.readywait import StartedProcess, wait_ready
from fleetgen.engines import RuleSet, get_engine
from fleetgen.engines.sglang_timeline import rules_for
from fleetgen.errors import LaunchFailed
from fleetgen.http.client import EngineClient
from fleetgen.remote.local import LocalHost
from tests.fixtures.ports import free_port

REAL = Path(__file__).parents[2] / "data" / "real-engines"
REFUSAL = Path(__file__).parents[3] / "bench" / "results" / "raw" / "gpu-sglang-0.5.13-h200"
HANG_GUARD_S = 120.0  # only so a broken wait fails the test instead of hanging it


def _harmless_sglang_line() -> str:
    """The warning fleetgen's old signature took for the cause, as the real engine logged it."""
    up = (REAL / "sglang-0.5.15-h200/mtp/up-attempt1-cutlass.txt").read_text().splitlines()
    return next(x for x in up if x.strip().startswith("matched: ")).strip().removeprefix("matched: ")


async def _replay(
    tmp_path: Path, engine_name: str, log_text: str, rules: RuleSet | None = None, pause_s: float = 0.0
) -> LaunchFailed:
    """The log written by a real process that then exits 1; with `pause_s`, its second half that much later
    (an engine logs its first fatal line, then the traceback that names the cause)."""
    lines = log_text.splitlines(keepends=True)
    half = len(lines) // 2 if pause_s else len(lines)
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    first.write_text("".join(lines[:half]))
    second.write_text("".join(lines[half:]))
    script = tmp_path / "launch.sh"
    script.write_text(
        f"#!/bin/sh\ncat {shlex.quote(str(first))}\nsleep {pause_s}\ncat {shlex.quote(str(second))}\nexit 1\n"
    )
    script.chmod(0o755)
    async with LocalHost("local") as host, aiohttp.ClientSession() as http:
        spawned = await host.spawn(str(script), str(tmp_path / "engine.log"), str(tmp_path / "pid"))
        proc = StartedProcess("h200-0", host, spawned.pid, spawned.start_time, spawned.log_path)
        client = EngineClient(f"http://127.0.0.1:{free_port()}", session=http)
        with pytest.raises(LaunchFailed) as failed:
            engine = get_engine(engine_name)
            rules = rules or engine.rule_sets[-1]
            await wait_ready(proc, engine, client, rules=rules, timeout_s=HANG_GUARD_S)
    return failed.value


async def test_vllm_engine_core_failure_shows_the_engine_core_traceback(tmp_path: Path) -> None:
    log = (REAL / "vllm-0.24.0-h200/engine-mtp-attempt1-tail.txt").read_text()
    error = await _replay(tmp_path, "vllm", log)
    assert "ModuleNotFoundError: No module named 'flashinfer'" in error.message
    assert error.context["root cause"] == "ModuleNotFoundError: No module named 'flashinfer'"
    assert "install the missing module" in error.fix


async def test_sglang_missing_module_below_a_harmless_warning_is_the_cause(tmp_path: Path) -> None:
    tail = (REAL / "sglang-0.5.15-h200/mtp/engine-attempt1-tail.txt").read_text()
    error = await _replay(tmp_path, "sglang", _harmless_sglang_line() + "\n" + tail)
    assert "No module named 'cutlass'" in error.message
    assert "cuda.tile" not in error.message and "launcher module" not in error.message


@pytest.mark.parametrize(("version", "needs_env"), [("0.5.10", True), ("0.5.13", False)])
async def test_sglang_spec_radix_refusal_gets_the_fix_of_the_release_that_launched(
    tmp_path: Path, version: str, needs_env: bool
) -> None:
    """SGLang 0.5.13's real refusal (CPU rehearsal log) read by the ready wait of a launch decided by
    `version`'s rules: SGLANG_ENABLE_SPEC_V2=1 is part of the fix only where that release has it off
    (0.5.10)."""
    log = (REFUSAL / "rehearsal-cpu" / "engine-alone.log").read_text()
    error = await _replay(tmp_path, "sglang", log, rules_for(version))
    assert "extra_buffer Mamba strategy" in error.message
    assert 'mamba-scheduler-strategy = "extra_buffer"' in error.fix
    assert ("SGLANG_ENABLE_SPEC_V2" in error.fix) == needs_env


async def test_an_engine_dying_in_its_prefill_graph_capture_is_named_by_the_out_of_memory_that_caused_it(
    tmp_path: Path,
) -> None:
    """SGLang 0.5.17 on an H100 (tune's no-radix-76-mf91-replayssm): out of memory capturing its prefill CUDA
    graph. It logged "CUDA error: the operation cannot be performed in the present state" first and the
    traceback whose "CUDA error: out of memory" caused it a second later: the failure names the cause in the
    engine's words and where it was, with the fix for memory, never only "the CUDA runtime failed"."""
    log = (REAL / "sglang-0.5.17-h100-mmcpu-tune/no-radix-76-mf91-replayssm-died.log").read_text()
    at = log.index("CUDA error: out of memory")
    assert "CUDA error: the operation cannot" in log[:at]  # the consequence comes first, as logged
    assert len(log[:at].splitlines()) >= len(log.splitlines()) // 2  # the cause comes in the second half
    error = await _replay(tmp_path, "sglang", log, rules_for("0.5.17"), pause_s=1.0)
    assert error.message.startswith(
        "h200-0: GPU out of memory: torch.AcceleratorError: CUDA error: out of memory"
    ), error.message
    assert error.message.endswith("(at graphs.py:126 in capture_end)"), error.message
    assert "mem-fraction-static" in error.fix
