"""`tune.fleetfile`: the fleet files tune writes (its comments, and `plan` reading it back with the
winners' argv), and the per-host engine_args they hold (config, plan and up decide the same argv)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.config import FleetFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.wanted import build_command, build_wanted, refuse_simulated_acceptance
from fleetgen.engines import get_engine
from fleetgen.errors import ConfigError
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.fleetfile import candidate_data, file_data, split_args, tuned_text
from tests.unit.tune._helpers import QWEN, _two_class_fleet, fleet_file, measured, setting

# --- the fleet files tune writes ---------------------------------------------------------------------------


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["h0", "h1", "h2"]),
        st.dictionaries(st.sampled_from(list("abcde")), st.integers(0, 3), max_size=5),
        min_size=1,
    )
)
def test_split_args_merged_back_give_every_host_exactly_its_own(chosen: dict[str, dict[str, int]]) -> None:
    common, own = split_args(chosen)
    for host, args in chosen.items():
        assert {**common, **own[host]} == args


def test_the_tuned_file_round_trips_through_plan_with_each_class_winners_argv(tmp_path: Path) -> None:
    """Two classes choose differently: the shared flags go to [engine.args], the rest to each host's
    engine_args; `plan` of the written file launches each instance with exactly its winner's flags."""
    path = _two_class_fleet(tmp_path)
    fleet = Fleet.load(path)
    small, big = GpuClass(96, 1), GpuClass(179, 1)
    base = dict(fleet.file.engine.args)
    win_small = setting(
        "no-radix-96", 96, **base, **{"disable-radix-cache": True, "max-running-requests": 96}
    )
    win_big = setting(
        "no-radix-256", 256, **base, **{"disable-radix-cache": True, "max-running-requests": 256}
    )
    baseline = measured(setting("as-written", 8, **base), 700.0, small)
    chosen = {small: measured(win_small, 1800.0, small), big: measured(win_big, 3000.0, big)}
    text = tuned_text(
        file_data(fleet.file, path),
        path,
        chosen,
        {"rtx": small, "b200": big},
        {small: baseline, big: None},
        ["written by a test"],
    )
    out = tmp_path / "fleet.tuned.toml"
    out.write_text(text)
    tuned = Fleet.load(out).file
    data = tomllib.loads(text)
    assert data["engine"]["args"] == {**base, "disable-radix-cache": True}
    assert data["hosts"][0]["engine_args"] == {"max-running-requests": 96}
    facts = {h.name: facts_from_file(h) for h in tuned.hosts}
    plans = {p.instance: p for p in plan_fleet(tuned, QWEN, facts).instances}
    for name, win in {"rtx-0": win_small, "rtx-1": win_small, "b200-0": win_big}.items():
        # the same fleet with the winner's flags as everyone's [engine.args]: what this instance must run
        hosts = [h.model_copy(update={"engine_args": {}}) for h in tuned.hosts]
        alone = tuned.model_copy(
            update={"engine": tuned.engine.model_copy(update={"args": win.args}), "hosts": hosts}
        )
        expected = {p.instance: p.argv for p in plan_fleet(alone, QWEN, facts).instances}
        assert plans[name].argv == expected[name], name
    # each chosen flag carries what was measured; the user's own flags carry nothing
    lines = text.splitlines()
    [radix] = [line for line in lines if line.startswith("disable-radix-cache")]
    assert "# tune 2026-12-03 10:00 UTC: 96 GiB: no-radix-96, 1,800 decode tok/s per GPU" in radix
    [mine] = [line for line in lines if line.startswith("mem-fraction-static")]
    assert "#" not in mine
    [big_line] = [line for line in lines if line.startswith("max-running-requests = 256")]
    assert "179 GiB: no-radix-256, 3,000 decode tok/s per GPU" in big_line and "×" not in big_line
    [small_line] = [line for line in lines if line.startswith("max-running-requests = 96")]
    assert "2.57× the file's own" in small_line
    assert text.startswith("# written by a test\n")


def test_a_candidates_fleet_is_one_renamed_instance_on_its_own_port(tmp_path: Path) -> None:
    path = _two_class_fleet(tmp_path)
    fleet = Fleet.load(path)
    [inst] = [i for i in fleet.file.instances() if i.name == "rtx-1"]
    data = candidate_data(file_data(fleet.file, path), inst, 3, {"max-running-requests": 7}, {"X": "1"})
    derived = FleetFile.model_validate(data)
    [only] = derived.instances()
    assert (only.name, only.gpus, only.port) == ("rtx-tune3-0", (1,), inst.port + 100)
    assert derived.engine.args == {"max-running-requests": 7} and derived.engine.env == {"X": "1"}
    assert fleet.file.engine.args != derived.engine.args  # the user's file is another object, untouched


# --- per-host engine_args ----------------------------------------------------------------------------------


def test_a_hosts_engine_args_merge_over_engine_args_in_plan_and_up_alike() -> None:
    fleet = fleet_file(
        [
            {"name": "a", "gpus": [0], "gpu_memory_gib": 95.6, "engine_args": {"max-running-requests": 32}},
            {"name": "b", "gpus": [0], "gpu_memory_gib": 179.1},
        ],
        {"max-running-requests": 16, "reasoning-parser": "qwen3"},
    )
    assert fleet.engine_for("a").args == {"max-running-requests": 32, "reasoning-parser": "qwen3"}
    assert fleet.engine_for("b") is fleet.engine
    facts = {h.name: facts_from_file(h) for h in fleet.hosts}
    plans = {p.instance: p for p in plan_fleet(fleet, QWEN, facts).instances}
    survey = HostSurvey(workdir="/w", has_nvidia_smi=False, uptime_s=1.0, clk_tck=100)
    for inst in fleet.instances():
        for launched in (
            build_command(fleet, get_engine("sglang"), inst, "/w"),  # from the file alone
            build_wanted(fleet, get_engine("sglang"), inst, survey, None).command,  # as `up` measured
        ):
            assert plans[inst.name].argv[1:] == (*launched.launcher, *launched.args)
    assert "32" in plans["a-0"].argv and "16" not in plans["a-0"].argv
    assert plans["a-0"].memory.max_running_requests <= 32 < plans["b-0"].memory.max_running_requests + 32


def test_a_hosts_engine_args_are_checked_like_engine_args() -> None:
    for bad, why in (({"--tp": 2}, "without dashes"), ({"port": 1}, "set by fleetgen")):
        with pytest.raises(ValueError, match=why):
            fleet_file([{"name": "a", "gpus": [0], "engine_args": bad}])


def test_a_forced_acceptance_in_a_hosts_engine_args_is_refused_by_up_and_run(tmp_path: Path) -> None:
    conf = '{"method": "mtp", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic"}'
    engine = {"kind": "vllm", "model": "/m"}
    data = {
        "engine": engine,
        "hosts": [{"name": "a", "gpus": [0], "engine_args": {"speculative-config": conf}}],
    }
    fleet = Fleet(tmp_path / "f.toml", FleetFile.model_validate(data), get_engine("vllm"))
    with pytest.raises(ConfigError, match="rejection_sample_method=synthetic"):
        refuse_simulated_acceptance(fleet)
