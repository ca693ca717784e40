"""SGLang 0.5.23's OWN code against fleetgen's plan (marker `sglang`).

Needs a python with SGLang 0.5.23 installed (`pip install --no-deps` the wheel + the modules its server_args
imports, see real-components.md); point FLEETGEN_SGLANG_PYTHON at it (e.g. /opt/sglang-venv/bin/python).
Skipped locally, with the reason, when it is not there; a failure under CI (tests/fixtures). No fake:
SGLang's parser and config classes run for real; the server itself cannot run here (no GPU, no sgl_kernel).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fleetgen.config import FleetFile, load_fleet
from fleetgen.deploy.wanted import build_command
from fleetgen.engines import get_engine
from fleetgen.fleet.planning import plan_from_file
from fleetgen.modelcard import load_model_shape
from fleetgen.plan.sglang.memory import kv_bytes_per_token, state_bytes_per_request
from tests.fixtures import skip_or_fail
from tests.fixtures.planmodels import GPU96, MODELS, MOTIVATING, plan_one
from tests.fixtures.sglang import marked_json, named_python, real_sglang_python, run_script

pytestmark = pytest.mark.sglang
PYTHON = str(named_python() or "")  # checked by the fixture before any test here uses it


@pytest.fixture
def sglang_python() -> str:
    return real_sglang_python()


needs_sglang = pytest.mark.usefixtures("sglang_python")


def _parse(argv: list[str]) -> dict[str, object]:
    script = get_engine("sglang").parser_check_script()
    done = run_script(PYTHON, script, argv)
    verdict = get_engine("sglang").parse_verdict(done.stdout)
    return {"ok": verdict.is_ok, "error": verdict.error, "resolved": dict(verdict.resolved)}


@needs_sglang
def test_real_parser_accepts_the_argv_the_plan_produces_for_0_5_23() -> None:
    args = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer", "cuda-graph-max-bs": 32}
    plan = plan_one(args, version="0.5.23", gpu_gib=GPU96)
    assert any(w.rule == "renamed-flag" for w in plan.warnings)
    engine_args = list(plan.argv[3:])  # after python -m sglang.launch_server
    verdict = _parse(engine_args)
    assert verdict["ok"], verdict["error"]
    resolved = verdict["resolved"]
    assert isinstance(resolved, dict)
    assert resolved["mamba_radix_cache_strategy"] == "extra_buffer"
    assert resolved["mem_fraction_static"] == 0.9


@needs_sglang
def test_real_parser_rejects_the_old_names_as_the_plan_says() -> None:
    unknown = _parse(["--model-path", "/m", "--mamba-scheduler-strategy", "extra_buffer"])
    assert not unknown["ok"] and "unrecognized arguments: --mamba-scheduler-strategy" in str(unknown["error"])
    ambiguous = _parse(["--model-path", "/m", "--cuda-graph-max-bs", "32"])
    assert not ambiguous["ok"] and "ambiguous option: --cuda-graph-max-bs" in str(ambiguous["error"])


# SGLang's config package __init__ imports every VLM config (torchvision, which has no CPU build here), so the
# cross-check loads `sglang.srt.configs` as a bare namespace and imports only the modules planning relies on.
CROSS_CHECK = r"""
import json, sys, types
import sglang.srt
pkg = types.ModuleType("sglang.srt.configs")
pkg.__path__ = [sglang.srt.__path__[0] + "/configs"]
sys.modules["sglang.srt.configs"] = pkg
import torch
from sglang.srt.configs import qwen3_next, qwen3_5, mamba_utils
cases = json.loads(sys.stdin.read())
out = []
for case in cases:
    cls = qwen3_5.Qwen3_5TextConfig if case["kind"] == "qwen3_5" else qwen3_next.Qwen3NextConfig
    cfg = cls(**case["config"])
    qwen3_next.linear_attn_tp_size = lambda tp=case["tp"]: tp   # the attn-TP width the runtime would report
    params = cfg.mamba2_cache_params
    if case["ssm_dtype"] == "bfloat16":
        bf16 = mamba_utils.Mamba2StateDType(conv=torch.bfloat16, temporal=torch.bfloat16)
        params = type(params)(shape=params.shape, layers=params.layers, dtype=bf16)
    out.append({"state": int(params.mamba_cache_per_req), "full": list(cfg.full_attention_layer_ids),
                "linear": list(cfg.linear_layer_ids)})
print("FLEETGEN_XCHECK " + json.dumps(out))
"""


def _cross_check(cases: list[dict[str, object]]) -> list[dict[str, object]]:
    done = run_script(PYTHON, CROSS_CHECK, cases)
    result: list[dict[str, object]] | None = marked_json(done.stdout, "FLEETGEN_XCHECK")
    if result is None:
        skip_or_fail("SGLang's config classes", f"they did not import: {done.stderr.strip()[-2000:]}")
    return result


@needs_sglang
def test_state_bytes_and_layers_equal_sglangs_own_classes() -> None:
    """State per request from SGLang's `mamba2_cache_params`; layer ids from its config classes. The KV cell's
    head rule lives in ModelConfig, which imports GPU kernels (tvm_ffi) and cannot load here; what we can
    check is the layer count it multiplies (full_attention_layer_ids)."""
    cases, ours = [], []
    for folder, kind in (("qwen3.6-27b", "qwen3_5"), ("qwen3-next-80b-a3b", "qwen3_next")):
        raw = json.loads((MODELS / folder / "config.json").read_text())
        text = raw.get("text_config", raw)
        shape = load_model_shape(MODELS / folder)
        for tp in (1, 2, 4, 8):
            for ssm in ("float32", "bfloat16"):
                cases.append({"kind": kind, "config": text, "tp": tp, "ssm_dtype": ssm})
                ours.append(
                    (
                        state_bytes_per_request(shape, tp, ssm),
                        list(shape.full_attention_layer_ids),
                        list(shape.linear_layer_ids),
                        kv_bytes_per_token(shape, tp, 2),
                    )
                )
    theirs = _cross_check(cases)
    for case, mine, sglang in zip(cases, ours, theirs, strict=True):
        assert mine[0] == sglang["state"], case["tp"]
        assert mine[1] == sglang["full"] and mine[2] == sglang["linear"]
        assert mine[3] > 0


def _local_fleet(tmp_path: Path, extra: dict[str, object]) -> Path:
    args = {**MOTIVATING, "mamba-scheduler-strategy": "extra_buffer", "context-length": 8192, **extra}
    lines = [
        "[engine]",
        'kind = "sglang"',
        'version = "0.5.23"',
        f'python = "{PYTHON}"',
        'model = "/m"',
        f'model_config = "{MODELS / "qwen3.6-27b"}"',
        "[engine.args]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in args.items()]
    lines += ["[[hosts]]", 'name = "here"', 'ssh = "local"', "gpus = [0]", f"gpu_memory_gib = {GPU96}"]
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@needs_sglang
async def test_online_plan_runs_the_hosts_own_parser(tmp_path: Path) -> None:
    """`fleetgen plan` online on a local host: hostcheck, then SGLang's own parser on the exact argv."""
    path = _local_fleet(tmp_path, {})
    plan = await plan_from_file(load_fleet(path), path, offline=False, target=None)
    inst = plan.instances[0]
    assert not [e for e in inst.errors if e.rule == "engine-parser"], inst.errors
    assert any(w.rule == "renamed-flag" for w in inst.warnings)
    bad = _local_fleet(tmp_path, {"not-a-real-flag": 1})
    refused = await plan_from_file(load_fleet(bad), bad, offline=False, target=None)
    error = next(e for e in refused.instances[0].errors if e.rule == "engine-parser")
    assert "unrecognized arguments: --not-a-real-flag 1" in error.message
    assert not refused.fits


@needs_sglang
def test_real_sglang_reads_the_key_from_the_config_file_fleetgen_writes(tmp_path: Path) -> None:
    """SGLang's own `prepare_server_args` (what `python -m sglang.launch_server` runs) reads `api_key` from
    the 0600 `--config` YAML fleetgen renders, quotes and backslashes included; the argv holds no key."""
    fleet = FleetFile.model_validate(
        {
            "engine": {"kind": "sglang", "model": "/m", "bind": "0.0.0.0", "api_key_env": "K"},
            "hosts": [{"name": "h", "gpus": [0]}],
        }
    )
    key = 'sk-"q"\\x-' + os.urandom(8).hex()
    command = build_command(fleet, get_engine("sglang"), fleet.instances()[0], str(tmp_path))
    (tmp_path / "h-0").mkdir()
    for path, data in command.secret_files(key).items():
        Path(path).write_bytes(data)
    code = (
        "import sys\nfrom sglang.srt.server_args import prepare_server_args\n"
        "print(repr(prepare_server_args(sys.argv[1:]).api_key))"
    )
    done = subprocess.run(  # in the instance folder, as `up` spawns it (the config file is named relative)
        [PYTHON, "-c", code, *command.args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path / "h-0",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == repr(key)
    assert not any(key in a for a in command.args) and "--config" in command.args
