"""Simulated acceptance (issue 20 §2): settings that make an engine commit tokens the model did not choose.

Each engine names its own (`Engine.simulated_acceptance`, over a launch's argv and env); `up`, `restart`
and `run` refuse a fleet that carries one (`deploy.wanted.refuse_simulated_acceptance`), and only a caller
that passes `allow_simulated_acceptance` (`tune`) launches it.

Filed under `engines` (each engine's `simulated_acceptance`); the refusal is `deploy/wanted.py`'s."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetgen.cli import register
from fleetgen.cli.app import app
from fleetgen.config import FleetFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import up
from fleetgen.deploy.wanted import refuse_simulated_acceptance
from fleetgen.engines import ENGINES, get_engine
from fleetgen.engines.base import Engine
from fleetgen.errors import ConfigError

register([])
SGLANG, VLLM = get_engine("sglang"), get_engine("vllm")
ACC_LEN, ACC_METHOD, ACC_MODE = (
    "SGLANG_SIMULATE_ACC_LEN",
    "SGLANG_SIMULATE_ACC_METHOD",
    "SGLANG_SIMULATE_ACC_TOKEN_MODE",
)
SIMULATE_ENV = (ACC_LEN, ACC_METHOD, ACC_MODE)

# Flags and env an ordinary launch carries: they never count.
OTHER_ARGV = st.lists(
    st.sampled_from(
        ["/models/q", "--max-model-len", "4096", "--speculative-algorithm", "EAGLE", "--tp-size", "2"]
    )
)
OTHER_ENV = st.dictionaries(
    st.sampled_from(["CUDA_VISIBLE_DEVICES", "SGLANG_ENABLE_SPEC_V2", "VLLM_CPU_KVCACHE_SPACE", "SIM_MARK"]),
    st.text(max_size=8),
)
LENGTHS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-5, 5).map(str),
    st.sampled_from(["", "three", " 3.0 ", "-1"]),
)


def sglang_simulates(length: str) -> bool:
    """SGLang's own reading: `SIMULATE_ACC_LEN > 0` (srt/speculative/eagle_utils.py); a value it cannot read
    as a number is no run fleetgen lets through either."""
    try:
        return float(length) > 0
    except ValueError:
        return True


@given(
    length=st.none() | LENGTHS,
    companions=st.dictionaries(
        st.sampled_from([ACC_METHOD, ACC_MODE]), st.sampled_from(["fixed", "match-expected"])
    ),
    other_env=OTHER_ENV,
    argv=OTHER_ARGV,
)
def test_sglang_names_its_simulated_acceptance_env_exactly_when_it_would_simulate(
    length: str | None, companions: dict[str, str], other_env: dict[str, str], argv: list[str]
) -> None:
    env = {**other_env, **companions, **({ACC_LEN: length} if length is not None else {})}
    found = SGLANG.simulated_acceptance(argv, env)
    if length is None or not sglang_simulates(length):
        assert found == ()  # absent, or off (≤ 0, nan): the companions alone change nothing
        return
    assert found[0] == f"{ACC_LEN}={length}"
    assert set(found) == {f"{name}={env[name]}" for name in SIMULATE_ENV if name in env}  # named with it
    assert SGLANG.simulated_acceptance([], env) == found  # argv plays no part: SGLang reads it from env


@pytest.mark.parametrize(
    ("length", "simulates"),
    [("3.0", True), ("0.5", True), ("0", False), ("-1", False), ("nan", False), ("x", True)],
)
def test_sglang_examples(length: str, simulates: bool) -> None:
    assert bool(SGLANG.simulated_acceptance([], {ACC_LEN: length})) is simulates


SPEC_CONFIGS = st.fixed_dictionaries(
    {"method": st.sampled_from(["mtp", "eagle3"]), "num_speculative_tokens": st.integers(1, 7)},
    optional={
        "rejection_sample_method": st.sampled_from(["standard", "synthetic", "block"]),
        "synthetic_acceptance_length": st.floats(1, 8),
    },
)


@st.composite
def spec_argv(draw: st.DrawFn, conf: dict[str, Any]) -> list[str]:
    """`conf` as a user may write it for vLLM's parser: one JSON (`--flag JSON`, `--flag=JSON`, either
    spelling of the flag), or some keys as JSON and the rest as `--speculative-config.KEY VALUE`."""
    flag = draw(st.sampled_from(["--speculative-config", "--speculative_config"]))
    dotted_keys = draw(st.sets(st.sampled_from(sorted(conf)))) if conf else set()
    whole = {k: v for k, v in conf.items() if k not in dotted_keys}
    argv: list[str] = []
    if whole or not dotted_keys:
        text = json.dumps(whole)
        argv += draw(st.sampled_from([[flag, text], [f"{flag}={text}"]]))
    for key in sorted(dotted_keys):
        spelled = key.replace("_", "-") if draw(st.booleans()) else key
        value = conf[key] if isinstance(conf[key], str) and draw(st.booleans()) else json.dumps(conf[key])
        argv += draw(st.sampled_from([[f"{flag}.{spelled}", str(value)], [f"{flag}.{spelled}={value}"]]))
    return argv


@given(data=st.data(), conf=SPEC_CONFIGS, before=OTHER_ARGV, after=OTHER_ARGV, env=OTHER_ENV)
def test_vllm_names_a_synthetic_rejection_sampler_however_the_config_is_spelled(
    data: st.DataObject, conf: dict[str, Any], before: list[str], after: list[str], env: dict[str, str]
) -> None:
    argv = [*before, *data.draw(spec_argv(conf)), *after]
    found = VLLM.simulated_acceptance(argv, {**env, ACC_LEN: "3.0"})  # SGLang's variable means nothing here
    if conf.get("rejection_sample_method") != "synthetic":
        assert found == (), argv
        return
    assert "--speculative-config rejection_sample_method=synthetic" in found, argv
    if "synthetic_acceptance_length" in conf:
        length = float(conf["synthetic_acceptance_length"])
        [said] = [f for f in found if "synthetic_acceptance_length=" in f]
        assert math.isclose(float(said.rpartition("=")[2]), length)


@given(conf=SPEC_CONFIGS)
def test_vllm_reads_the_argv_fleetgen_renders_from_engine_args(conf: dict[str, Any]) -> None:
    fleet = FleetFile.model_validate(
        {
            "engine": {
                "kind": "vllm",
                "model": "/models/q",
                "args": {"speculative-config": json.dumps(conf)},
            },
            "hosts": [{"name": "a", "gpus": [0]}],
        }
    )
    argv = VLLM.build_argv(fleet.engine, fleet.instances()[0], VLLM.rule_sets[0])
    is_synthetic = conf.get("rejection_sample_method") == "synthetic"
    assert bool(VLLM.simulated_acceptance(argv, {})) is is_synthetic


def test_each_engine_owns_its_settings_and_an_engine_without_any_names_none() -> None:
    synthetic = ["--speculative-config", '{"method": "mtp", "rejection_sample_method": "synthetic"}']
    assert SGLANG.simulated_acceptance(synthetic, {}) == ()
    assert VLLM.simulated_acceptance([], {ACC_LEN: "3"}) == ()
    assert Engine.simulated_acceptance(SGLANG, synthetic, {ACC_LEN: "3"}) == ()  # the default
    assert set(ENGINES) == {"sglang", "vllm"}  # a new engine: add its settings here, or say it has none


def _fleet(tmp_path: Path, kind: str, *, args: str = "", env: str = "") -> Path:
    """A fleet file whose one host listens nowhere: whatever tries to reach it fails at once."""
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[engine]\nkind = "{kind}"\nmodel = "/models/q"\n\n[engine.args]\n{args}\n[engine.env]\n{env}\n'
        '[[hosts]]\nname = "h"\nssh = "nobody@127.0.0.1:1"\ngpus = [0]\n',
        encoding="utf-8",
    )
    return path


def test_the_refusal_names_the_setting_its_table_and_the_fix(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "sglang", env=f'{ACC_LEN} = "3.0"\n{ACC_METHOD} = "match-expected"\nOTHER = "1"')
    with pytest.raises(ConfigError) as caught:
        refuse_simulated_acceptance(Fleet.load(path))
    exc = caught.value
    assert f"{ACC_LEN}=3.0, {ACC_METHOD}=match-expected" in exc.message and "did not choose" in exc.message
    assert f"remove these settings from [engine.env] of {path}" in exc.fix
    assert "fleetgen tune --simulate-accept-length" in exc.fix and exc.exit_code == 2

    conf = '{"method": "mtp", "rejection_sample_method": "synthetic"}'
    vllm = _fleet(tmp_path, "vllm", args=f'"speculative-config" = {json.dumps(conf)}')
    with pytest.raises(ConfigError, match=r"rejection_sample_method=synthetic") as caught:
        refuse_simulated_acceptance(Fleet.load(vllm))
    assert "from [engine.args] of" in caught.value.fix

    refuse_simulated_acceptance(Fleet.load(_fleet(tmp_path, "sglang", env=f'{ACC_LEN} = "-1"')))  # off


async def test_up_refuses_before_reaching_any_host_unless_the_caller_allows_it(tmp_path: Path) -> None:
    """The host listens nowhere: a refusal raised before any connection is a ConfigError; with the tuner's
    permission `up` goes on, and fails there (at the connection) instead."""
    fleet = Fleet.load(_fleet(tmp_path, "sglang", env=f'{ACC_LEN} = "3.0"'))
    with pytest.raises(ConfigError, match=ACC_LEN):
        await up(fleet)
    with pytest.raises(ConfigError, match=ACC_LEN):
        await up(fleet, force=True)  # restart
    [out] = await up(fleet, allow_simulated_acceptance=True)
    assert out.error is not None and ACC_LEN not in out.error.message


def test_run_on_such_a_fleet_exits_as_a_usage_error_before_reaching_a_host(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "sglang", env=f'{ACC_LEN} = "2.5"')
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n', encoding="utf-8")
    argv = ["run", str(prompts), "-o", str(tmp_path / "out"), "-f", str(path), "--no-live"]
    result = CliRunner().invoke(app, argv)
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert f"{ACC_LEN}=2.5" in text and "fix: remove it from [engine.env]" in text
    assert not (tmp_path / "out").exists()
