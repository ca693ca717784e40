"""The plan against real engines: every run captured on an H200 (tests/data/real-engines/) is planned from its
own fleet file and compared with the numbers the engine itself logged at start.

Invariant: for every captured run, planned KV tokens, max concurrency / running requests and Mamba slots are
within 5 % of what the engine reported (the SGLang no-spec run, already right before, within 2 %); for every
setting `fleetgen tune` measured on SGLang 0.5.15 (and the capacity runs before it), KV tokens within
2.5 %, Mamba slots and max running exact, and the tune job's running requests within 5 % of the most the
engine ran. The engines' numbers are read from their own log lines here, never copied into the test.

Filed under `plan` (`plan_fleet` through `plan/sglang/memory.py` and `plan/vllm/memory.py`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fleetgen.config import FleetFile, load_job
from fleetgen.generate.jobshape import output_lengths_of, read_job_shape
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import InstancePlan, plan_fleet
from fleetgen.plan.job import JobShape
from fleetgen.plan.sglang.memory import SGLangExtras
from fleetgen.plan.types import GIB, GpuFacts, HostFacts
from fleetgen.plan.vllm.memory import pool_layout

DATA = Path(__file__).parents[2] / "data"
BENCH = Path(__file__).parents[3] / "bench" / "gpu"
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
    return _plan_fleet(FleetFile.model_validate(tomllib.loads(fleet_path.read_text())))


def _plan_fleet(fleet_file: FleetFile, job: JobShape | None = None, total: int = H200_TOTAL) -> InstancePlan:
    facts = {
        h.name: HostFacts(h.name, gpus=(GpuFacts(0, total, total, measured=True),)) for h in fleet_file.hosts
    }
    return plan_fleet(fleet_file, QWEN, facts, None, job=job).instances[0]


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


@dataclass(frozen=True)
class Capture:
    """One SGLang start on a GPU: its flags over its folder's fleet.toml, its log extract, the card's memory
    (`gpu_total_mib` in runs.toml; the H200 where none is named) and whether it never decoded (`stalled`)."""

    folder: Path
    name: str
    args: dict[str, Any]
    total: int = H200_TOTAL
    stalled: bool = False
    ramped: bool = False  # its batch grew over the window (the engine's admission): no single peak to check
    env: dict[str, str] = field(default_factory=dict)  # an engine env candidate's variables

    @property
    def log(self) -> str:
        return (self.folder / f"{self.name}.txt").read_text()

    @property
    def is_tune(self) -> bool:
        return self.folder.name.endswith("-tune")

    def fleet(self) -> FleetFile:
        raw = tomllib.loads((self.folder / "fleet.toml").read_text())
        raw["engine"]["args"] = {**raw["engine"]["args"], **self.args}
        raw["engine"]["env"] = {**raw["engine"].get("env", {}), **self.env}
        return FleetFile.model_validate(raw)


def _captures(folder: Path) -> list[Capture]:
    read = tomllib.loads((folder / "runs.toml").read_text())
    total = int(read["gpu_total_mib"]) << 20 if "gpu_total_mib" in read else H200_TOTAL
    return [
        Capture(
            folder,
            name,
            dict(run["args"]),
            total,
            bool(run.get("stalled")),
            bool(run.get("ramped")),
            dict(run.get("env", {})),
        )
        for name, run in read["runs"].items()
    ]


CAPTURES = [
    *_captures(REAL / "sglang-0.5.15-h200-tune"),
    *_captures(REAL / "sglang-0.5.15-h200-capacity"),
    *_captures(REAL / "sglang-0.5.17-h100-tune"),
    *_captures(REAL / "sglang-0.5.17-h100-mmcpu-tune"),
]
KV_TOLERANCE = 0.025


@cache
def tune_job() -> JobShape:
    """The job tune measured the candidates on, read as `plan --job … --output-lengths …` reads it."""
    return read_job_shape(
        load_job(BENCH / "tune-job.toml"),
        BENCH / "tune-prompts.jsonl",
        tokenizer_dir=None,
        output_lengths=output_lengths_of("mean=1800,min=300,max=6000"),
    )


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_captured_flags_are_the_ones_the_engine_ran(capture: Capture) -> None:
    """Each run's flags in runs.toml, as the engine's own server_args line shows them (True, 263, 'EAGLE')."""
    server_args = next(line for line in capture.log.splitlines() if "server_args=ServerArgs(" in line)
    for flag, value in capture.args.items():
        assert f" {flag.replace('-', '_')}={value!r}," in server_args, (flag, value)


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_planned_pools_are_what_sglang_allocated_for_every_captured_setting(capture: Capture) -> None:
    """KV tokens within 2.5 %, Mamba slots and SGLang's max running requests exact: with MTP on a small KV
    pool (66,002 tokens at 80 running) a gigabyte misplaced is a quarter of the pool."""
    planned = _plan_fleet(capture.fleet(), total=capture.total).to_json()
    real = engine_reported(capture.log)
    assert planned["kv_tokens"] == pytest.approx(real["kv_tokens"], rel=KV_TOLERANCE)
    assert planned["mamba_slots"] == real["mamba_slots"]
    assert planned["max_running_requests"] == real["max_running_requests"]


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_planned_startup_memory_is_what_sglang_measured(capture: Capture) -> None:
    """What SGLang measures before it sizes the pools: the free memory it starts from (`Load weight begin`)
    and what loading the target took (`mem usage`), each within 0.5 % (logged to 0.01 GB)."""
    memory = _plan_fleet(capture.fleet(), total=capture.total).memory
    free = _number(r"Load weight begin\. avail mem=([\d.]+) GB", capture.log.split("Load weight end")[0])
    loaded = _number(r"type=Qwen3_5ForConditionalGeneration, .*mem usage=([\d.]+) GB", capture.log)
    assert memory.free_bytes == pytest.approx(free * GIB, rel=0.005)
    assert memory.weights_bytes - SGLangExtras.of(memory).draft_weights_bytes == pytest.approx(
        loaded * GIB, rel=0.005
    )


TUNE = [c for c in CAPTURES if c.is_tune and not (c.stalled or c.ramped)]  # runs.toml says why each is not


@pytest.mark.parametrize("capture", TUNE, ids=[c.name for c in TUNE])
def test_planned_job_running_is_what_the_engine_ran_for_every_tune_candidate(capture: Capture) -> None:
    """The tune job's running requests the plan gives each candidate (66 of 75 for MTP: the KV pool binds),
    within 5 % of the most the engine ran under that job."""
    running = _plan_fleet(capture.fleet(), tune_job(), capture.total).job
    assert running is not None
    peak = _number(r"Decode batch, #running-req: (\d+),", capture.log)
    assert running.as_written.running == pytest.approx(peak, rel=0.05), running.as_written.bound


VLLM_TUNE = _captures(REAL / "vllm-0.24.0-h200-tune")
FULL_POOL = 99.0  # vLLM's "GPU KV cache usage" at or above this: the pool, not max-num-seqs, bounds the batch
STEADY_TOLERANCE = 0.07


@pytest.mark.parametrize("capture", VLLM_TUNE, ids=[c.name for c in VLLM_TUNE])
def test_planned_job_running_is_what_vllm_ran_for_every_tune_candidate(capture: Capture) -> None:
    """vLLM allocates a request's blocks as it grows: with its pool full it runs the requests a steady batch
    of the job holds, part-way through (298 where each request's blocks at its end give 244); the plan
    within 7 % of their mean over the engine's full-pool lines (the window opened with the requests past
    the plan's count fresh, lighter than steady), and a max-num-seqs that binds exactly."""
    running = _plan_fleet(capture.fleet(), tune_job()).job
    assert running is not None
    lines = re.findall(r"Running: (\d+) reqs, .* GPU KV cache usage: ([\d.]+)%", capture.log)
    full = [int(n) for n, used in lines if float(used) >= FULL_POOL]
    if "max-num-seqs" in capture.args:
        assert not full and running.as_written.running == max(int(n) for n, _ in lines)
    else:
        assert full, "the capture never filled its pool"
        steady = sum(full) / len(full)
        planned = running.as_written.running
        assert planned == pytest.approx(steady, rel=STEADY_TOLERANCE), running.as_written.bound
