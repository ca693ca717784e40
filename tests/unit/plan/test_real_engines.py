"""The plan against real engines: every run captured on an H200 (tests/data/real-engines/) is planned from its
own fleet file and compared with the numbers the engine itself logged at start.

Invariant: for every captured run, planned KV tokens, max concurrency / running requests and Mamba slots are
within 5 % of what the engine reported (the SGLang no-spec run, already right before, within 2 %). The
engines' numbers are read from their own log lines here, never copied into the test.

Filed under `plan` (`plan_fleet` through `plan/sglang/memory.py` and `plan/vllm/memory.py`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetgen.config import FleetFile
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import InstancePlan, plan_fleet
from fleetgen.plan.sglang.memory import SGLangExtras
from fleetgen.plan.types import GpuFacts, HostFacts
from fleetgen.plan.vllm.memory import pool_layout

DATA = Path(__file__).parents[2] / "data"
REAL = DATA / "real-engines"
QWEN = load_model_shape(DATA / "models" / "qwen3.6-27b")
H200_TOTAL = 143_771 << 20  # nvidia-smi memory.total [MiB] of the capture machine; 0 MiB used at start


@dataclass(frozen=True)
class Run:
    name: str
    fleet: Path
    log: Path
    tolerance: float


RUNS = (
    Run("vllm-mtp", REAL / "vllm-0.24.0-h200/fleet-mtp.toml", REAL / "vllm-0.24.0-h200/engine-mtp.log", 0.05),
    Run(
        "vllm-nospec",
        REAL / "vllm-0.24.0-h200/fleet-nospec.toml",
        REAL / "vllm-0.24.0-h200/engine-nospec.log",
        0.05,
    ),
    Run(
        "sglang-mtp",
        REAL / "sglang-0.5.15-h200/fleet-mtp.toml",
        REAL / "sglang-0.5.15-h200/mtp/startup-key-lines.txt",
        0.05,
    ),
    Run(
        "sglang-nospec",
        REAL / "sglang-0.5.15-h200/fleet-nospec.toml",
        REAL / "sglang-0.5.15-h200/nospec/startup-key-lines.txt",
        0.02,
    ),
)


def _plan(fleet_path: Path) -> InstancePlan:
    fleet = FleetFile.model_validate(tomllib.loads(fleet_path.read_text()))
    facts = {
        h.name: HostFacts(h.name, gpus=(GpuFacts(0, H200_TOTAL, H200_TOTAL, measured=True),))
        for h in fleet.hosts
    }
    return plan_fleet(fleet, QWEN, facts, None).instances[0]


def _number(pattern: str, text: str) -> float:
    found = re.findall(pattern, text)
    assert found, f"the capture has no line matching {pattern!r}"
    return float(found[-1].replace(",", ""))


def engine_reported(log: str) -> dict[str, float]:
    """KV tokens, max concurrency and (SGLang) Mamba slots, in the engine's own words."""
    if "GPU KV cache size" in log:  # vLLM
        return {
            "kv_tokens": _number(r"GPU KV cache size: ([\d,]+) tokens", log),
            "max_running_requests": _number(
                r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", log
            ),
        }
    return {
        "kv_tokens": _number(r"max_total_num_tokens=(\d+)", log),
        "max_running_requests": _number(r"max_total_num_tokens=.*max_running_requests=(\d+)", log),
        "mamba_slots": _number(r"max_mamba_cache_size: (\d+)", log),
    }


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_planned_capacity_is_within_tolerance_of_what_the_real_engine_reported(run: Run) -> None:
    plan = _plan(run.fleet)
    real = engine_reported(run.log.read_text())
    planned = plan.to_json()
    for key, value in real.items():
        assert planned[key] == pytest.approx(value, rel=run.tolerance), (key, planned[key], value)


def test_vllm_pool_layout_is_the_one_vllm_logged() -> None:
    """Block size (800 with MTP-3, 784 without), padding layers, blocks per request: as vLLM 0.24 logged."""
    mtp_log = (REAL / "vllm-0.24.0-h200/engine-mtp.log").read_text()
    nospec_log = (REAL / "vllm-0.24.0-h200/engine-nospec.log").read_text()
    metrics = (REAL / "vllm-0.24.0-h200/metrics-end-selected.txt").read_text()
    mtp = pool_layout(QWEN, {"speculative-config": '{"method": "mtp", "num_speculative_tokens": 3}'}, 1, 8192)
    nospec = pool_layout(QWEN, {}, 1, 8192)
    assert mtp.block_size == _number(r"Setting attention block size to (\d+) tokens", mtp_log)
    assert mtp.block_size == _number(r'[{,]block_size="(\d+)"', metrics)
    assert nospec.block_size == _number(r"Setting attention block size to (\d+) tokens", nospec_log)
    padding = int(_number(r"Add (\d+) padding layers", mtp_log))
    assert mtp.mamba_groups * mtp.group_size - len(QWEN.linear_layer_ids) == padding
    assert "padding layers" not in nospec_log and nospec.mamba_groups * nospec.group_size == 48
    # 1,270 blocks over 23 blocks per request = the logged 55.22x
    blocks = _number(r'num_gpu_blocks="(\d+)"', metrics)
    concurrency = _number(r'kv_cache_max_concurrency="([\d.]+)"', metrics)
    assert blocks / mtp.blocks_per_request == pytest.approx(concurrency, rel=1e-9)


def test_sglang_mtp_draft_weights_are_what_the_engine_loaded() -> None:
    """The MTP head loads its own embedding and LM head: "mem usage=5.53 GB" (GiB), not one layer's 0.83."""
    log = (REAL / "sglang-0.5.15-h200/mtp/startup-key-lines.txt").read_text()
    loaded = _number(r"type=Qwen3_5ForCausalLMMTP, .*mem usage=([\d.]+) GB", log) * (1 << 30)
    planned = SGLangExtras.of(_plan(REAL / "sglang-0.5.15-h200/fleet-mtp.toml").memory).draft_weights_bytes
    assert planned == pytest.approx(loaded, rel=0.05)
