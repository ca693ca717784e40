"""What fleetgen reads from real engines, checked on their captured output (tests/data/real-engines/).

Invariants, each on the real engine's own words:
- the cause shown for a failed start is the exception that caused it, not the last traceback and not a
  harmless line that mentions an error;
- a server whose speculation stepped during the test request is never refused; one whose speculation
  accepts nothing is never silently "verified";
- capacity the engine reports (log lines, /server_info, /metrics labels) is read for every engine.

Filed under `deploy` (`readywait.py` root causes, `verify.py` spec evidence, `hostsurvey.py`, `wanted.py`);
the capacity figures are `engines`', as `up` reads them.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from fleetgen.config import FleetFile
from fleetgen.deploy.death import GENERIC_SIGNATURES, first_fatal, root_cause
from fleetgen.deploy.hostsurvey import PREP_SH, VERSION_PY, survey_from_prep
from fleetgen.deploy.verify import judge_spec, spec_evidence
from fleetgen.deploy.wanted import measured_facts, planned_figures
from fleetgen.engines import get_engine
from fleetgen.http.metrics import Scrape
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.plan.types import MIB, GpuFacts

REAL = Path(__file__).parents[2] / "data" / "real-engines"
VLLM = REAL / "vllm-0.24.0-h200"
SGL_MTP = REAL / "sglang-0.5.15-h200" / "mtp"
QWEN = load_model_shape(Path(__file__).parents[2] / "data" / "models" / "qwen3.6-27b")
SGLANG, VLLM_ENGINE = get_engine("sglang"), get_engine("vllm")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _matched_line(up_output: Path) -> str:
    """The engine's own log line that fleetgen's old signature matched, as `up` quoted it."""
    line = next(x for x in _lines(up_output) if x.strip().startswith("matched: "))
    return line.strip().removeprefix("matched: ")


# ---- root cause, not the last traceback ------------------------------------------------------------------


def test_vllm_root_cause_is_the_engine_core_traceback_not_the_api_servers() -> None:
    lines = _lines(VLLM / "engine-mtp-attempt1-tail.txt")
    assert "See root cause above" in lines[-1] or any("See root cause above" in x for x in lines)
    assert root_cause(lines) == "ModuleNotFoundError: No module named 'flashinfer'"


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_oom_because_another_process_holds_the_gpu_names_that_not_the_flags(kind: str) -> None:
    """H200, SGLang 0.5.15: a stranger held 93.64 GiB when the engine loaded its weights; `up` said "lower
    mem-fraction-static" (the flags were fine). The engine's own OOM line names the other process."""
    lines = _lines(REAL / "sglang-0.5.15-h200" / "oom" / "engine-tail.txt")
    hit = first_fatal(lines, get_engine(kind).fatal_signatures)
    assert hit is not None
    signature, line = hit
    assert "another process" in signature.cause and "Process 5058 has 93.64 GiB" in line
    assert "mem-fraction" not in signature.fix and "nvidia-smi" in signature.fix
    # the same OOM with no other process on the GPU is the engine's own sizing: its flags are the fix
    alone = [x.split(" Process 5058")[0] for x in lines]
    alone_hit = first_fatal(alone, get_engine(kind).fatal_signatures)
    assert alone_hit is not None and alone_hit[0].cause == "GPU out of memory"


def test_sglang_root_cause_is_the_module_below_a_harmless_no_module_line() -> None:
    harmless = _matched_line(SGL_MTP / "up-attempt1-cutlass.txt")
    assert "No module named 'cuda.tile'" in harmless
    lines = [harmless, *_lines(SGL_MTP / "engine-attempt1-tail.txt")]
    assert root_cause(lines) == "ModuleNotFoundError: No module named 'cutlass'"
    # "Ignore import error … No module named 'cutlass'" lines and the warning are not failures
    assert first_fatal([harmless], GENERIC_SIGNATURES) is None
    ignored = [x for x in lines if "Ignore import error" in x]
    assert ignored and first_fatal(ignored, GENERIC_SIGNATURES) is None
    hit = first_fatal(lines, GENERIC_SIGNATURES)
    assert hit is not None and hit[1] == "ModuleNotFoundError: No module named 'cutlass'"


@pytest.mark.parametrize(
    "line",
    [
        "[2026-11-30 22:09:22] flashinfer.comm allreduce_fusion API is not available (No module named "
        "'cuda.tile'), falling back to standard implementation",
        "(EngineCore pid=1) WARNING 11-30 [x.py:1] Failed to import foo: No module named 'bar'",
        "/site/triton/semantic.py:1670: UserWarning: tl.where with a non-boolean condition is deprecated",
        "[2026-11-30 22:09:44] Ignore import error when loading sglang.srt.models.x: "
        "No module named 'cutlass'",
    ],
)
def test_lines_that_only_mention_an_error_are_no_root_cause(line: str) -> None:
    assert root_cause([line]) is None and first_fatal([line], GENERIC_SIGNATURES) is None


# ---- speculation: proven by what moves, never silently verified at zero acceptance -----------------------


def test_sglang_mtp_that_stepped_is_not_refused_before_its_averages_exist() -> None:
    """After the 24-token test request the real 0.5.15 server had 30 verify calls, accept length 0.0 and
    no avg_spec_accept_length: the old check (accept length only) refused it."""
    after = Scrape.parse((SGL_MTP / "metrics-before.txt").read_text()).samples
    info = json.loads((SGL_MTP / "server_info.json").read_text())
    assert SGLANG.accept_length(after) is None  # what the old check relied on
    assert SGLANG.accept_length(after, info) is None
    evidence = spec_evidence(SGLANG, {}, after, info)
    assert evidence.steps == 30
    assert judge_spec("h200-0", evidence) == (None, None)


def test_sglang_mtp_accepting_nothing_is_a_warning_naming_the_causes() -> None:
    before = Scrape.parse((SGL_MTP / "metrics-before.txt").read_text()).samples
    after = Scrape.parse((SGL_MTP / "metrics-after-chat.txt").read_text()).samples
    info = json.loads((SGL_MTP / "server_info-after-chat.json").read_text())
    error, warning = judge_spec("h200-0", spec_evidence(SGLANG, before, after, info))
    assert error is None and warning is not None
    assert "accept length 1.00" in warning and "draft weights" in warning and "dummy" in warning


def _verify_steps_moved_by(samples: dict[str, float], steps: int) -> dict[str, float]:
    name = SGLANG.metrics.spec_steps_total
    assert name is not None and name in samples
    return {**samples, name: samples[name] + steps}


@pytest.mark.parametrize("accepted_per_step", [0.0, 0.01, 0.049, 0.06, 0.5, 2.0, 3.0])
@pytest.mark.parametrize("steps", [1, 23, 200])
def test_sglang_acceptance_over_the_test_request_alone(accepted_per_step: float, steps: int) -> None:
    """Right after start the real SGLang reports no accept length yet (H200, 0.5.15 MTP: `up` saw "23 verify
    steps during the test request" and no figure, and said nothing of a draft that accepts nothing). The
    request's own tokens tell: 1 + (accepted drafts + 1 per step) → warned iff ~nothing is accepted."""
    samples = Scrape.parse((SGL_MTP / "metrics-before.txt").read_text()).samples
    before = {k: v for k, v in samples.items() if k != "sglang:spec_accept_length"}
    tokens = 1 + round(steps * (1 + accepted_per_step))
    evidence = spec_evidence(SGLANG, before, _verify_steps_moved_by(before, steps), None, tokens)
    accept = evidence.accept_length
    assert evidence.steps == steps and accept is not None and accept == pytest.approx((tokens - 1) / steps)
    error, warning = judge_spec("h200-0", evidence)
    assert error is None
    assert (warning is not None) == (accept - 1 < 0.05)
    assert spec_evidence(SGLANG, before, _verify_steps_moved_by(before, steps), None).accept_length is None


def test_vllm_mtp_with_3_of_838500_draft_tokens_accepted_is_not_silently_verified() -> None:
    after = Scrape.parse((VLLM / "metrics-end-selected.txt").read_text()).samples
    error, warning = judge_spec("h200-0", spec_evidence(VLLM_ENGINE, {}, after, None))
    assert error is None and warning is not None and "accepts almost nothing" in warning


def test_a_step_counter_that_did_not_move_refuses_the_server() -> None:
    samples = Scrape.parse((SGL_MTP / "metrics-before.txt").read_text()).samples
    zero = {k: v for k, v in samples.items() if k != "sglang:spec_accept_length"}
    error, _ = judge_spec("h200-0", spec_evidence(SGLANG, zero, zero, None))
    assert error is not None and "no speculative step happened" in error


# ---- capacity as the engines report it -------------------------------------------------------------------


def test_vllm_capacity_from_its_cache_config_info_and_its_log() -> None:
    text = (VLLM / "metrics-end-selected.txt").read_text()
    capacity = VLLM_ENGINE.capacity([], None, Scrape.parse(text).labels)
    assert capacity == {"kv_tokens": 452_340, "max_running_requests": pytest.approx(55.2174, rel=1e-4)}
    assert VLLM_ENGINE.max_running_from_capacity(capacity, None) == 55  # a floor: full-length requests
    assert VLLM_ENGINE.max_running_from_capacity(capacity, "32") == 32  # capped by max-num-seqs
    assert VLLM_ENGINE.max_running_from_capacity(capacity, "245") == 245  # set for the job: what it admits
    assert VLLM_ENGINE.max_running_from_capacity({}, "32") == 32  # max-num-seqs alone
    assert VLLM_ENGINE.max_running_from_capacity({}, None) is None
    assert SGLANG.max_running_from_capacity(capacity, "32") is None  # its info JSON says
    # without max-num-seqs the figure is a floor vLLM runs past (`run` fills it); SGLang's is its cap
    assert VLLM_ENGINE.running_is_floor(None) and VLLM_ENGINE.running_is_floor("0")
    assert not VLLM_ENGINE.running_is_floor("245") and not SGLANG.running_is_floor(None)
    log = _lines(VLLM / "engine-mtp.log")
    assert VLLM_ENGINE.capacity(log, None, {}) == {"kv_tokens": 452_340, "max_running_requests": 55.22}
    # what `up` shows as actual: the log's figures, then /metrics' over them
    assert VLLM_ENGINE.capacity(log, None, Scrape.parse(text).labels) == capacity


def test_sglang_capacity_from_server_info() -> None:
    info = json.loads((SGL_MTP / "server_info.json").read_text())
    capacity = {"kv_tokens": 535_802, "mamba_slots": 112, "max_running_requests": 22}
    assert SGLANG.capacity([], info, {}) == capacity
    # the effective per-DP-rank value (22), not the server arg (48); after the chat its average acceptance
    assert SGLANG.max_running_from_info(info) == 22 and VLLM_ENGINE.max_running_from_info(info) is None
    after_chat = json.loads((SGL_MTP / "server_info-after-chat.json").read_text())
    assert SGLANG.accept_length({}, after_chat) == 1.0
    # what `up` shows as actual: the log's figures, then /server_info's over them
    log = _lines(SGL_MTP / "startup-key-lines.txt")
    assert SGLANG.capacity(log, info, {}) == capacity and SGLANG.capacity(log, None, {}).keys() >= {
        "kv_tokens"
    }


@pytest.mark.parametrize(
    "fleet_file", [VLLM / "fleet-mtp.toml", REAL / "sglang-0.5.15-h200" / "fleet-mtp.toml"]
)
def test_up_plans_with_the_gpu_it_measured_when_the_fleet_file_states_none(fleet_file: Path) -> None:
    """The captured fleet files state no GPU memory: `up` showed "planned —" for every figure."""
    fleet = FleetFile.model_validate(tomllib.loads(fleet_file.read_text()))
    host = fleet.hosts[0]
    assert facts_from_file(host).gpus is None  # nothing known from the file, nothing invented
    measured = survey_from_prep("workdir=/w\nnvidia_smi=yes\ngpu_mib=0,143771,0\n")
    plan = plan_fleet(fleet, QWEN, {host.name: measured_facts(host, measured)}).instances[0]
    planned = planned_figures(plan)
    assert planned["kv_tokens"] > 0 and planned["max_running_requests"] > 0


def test_gpu_memory_comes_from_nvidia_smi_in_the_host_check(tmp_path: Path) -> None:
    """The host check's own shell snippet, with an nvidia-smi that prints what a real H200 + a board
    without memory readings print (a stand-in: no GPU here)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '0, 143771, 0\\n1, 143771, 1024\\n2, [N/A], [N/A]\\n'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(
        ["sh", "-c", PREP_SH, "fleetgen", "python3", "", "", str(tmp_path / "work"), VERSION_PY],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert survey_from_prep(out).gpus == (
        GpuFacts(0, 143_771 * MIB, 143_771 * MIB, measured=True),
        GpuFacts(1, 143_771 * MIB, 142_747 * MIB, measured=True),
    )


@pytest.mark.parametrize(
    "nvidia_smi",
    [
        "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
        "printf '0, NVIDIA H200, 143771, 0\\n'",
    ],
)
def test_a_host_survey_names_gpus_or_why_nvidia_smi_failed(tmp_path: Path, nvidia_smi: str) -> None:
    """`hosts check`, `plan` and `up` read one survey: the GPUs with their names, or nvidia-smi's own words
    when it fails (never a GPU invented from its error text); a workdir that cannot be made reads as none."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
    fake.chmod(0o755)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["sh", "-c", PREP_SH, "fleetgen", "python3", "", "", str(blocker / "work"), VERSION_PY]
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    survey = survey_from_prep(subprocess.run(argv, env=env, capture_output=True, text=True).stdout)
    assert survey.workdir == "" and survey.disk_free_bytes and survey.python_version and survey.os
    assert survey.mem_total_bytes and survey.mem_available_bytes and survey.has_nvidia_smi
    if "exit 9" in nvidia_smi:
        assert survey.gpu_rows == () and "could not communicate" in survey.gpu_error
    else:
        assert [(g.index, g.name) for g in survey.gpu_rows] == [(0, "NVIDIA H200")] and not survey.gpu_error


def test_each_engines_capacity_comes_from_its_own_start_up_lines() -> None:
    """Each engine reads capacity from its own log lines (`Engine.capacity_lines`), over its real H200 logs,
    and nothing when it reads the other's log."""
    logs = {
        SGLANG: [
            _lines(SGL_MTP / "startup-key-lines.txt"),
            _lines(SGL_MTP.parent / "nospec" / "startup-key-lines.txt"),
        ],
        VLLM_ENGINE: [_lines(VLLM / "engine-mtp.log"), _lines(VLLM / "engine-nospec.log")],
    }
    for engine, own in logs.items():
        other = next(e for e in logs if e is not engine)
        for lines in own:
            assert engine.capacity(lines, None, {})["kv_tokens"] > 0
            assert other.capacity(lines, None, {}) == {}
