"""`tune.session`: the refusals before anything starts, the candidates from the plan, a forced accept length
on tune's own server only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.config import JobFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.state import InstanceRecord, update_state
from fleetgen.deploy.wanted import refuse_simulated_acceptance
from fleetgen.errors import ConfigError
from fleetgen.plan import facts_from_file, plan_fleet
from fleetgen.plan.job import JobShape, LengthStats
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.fleetfile import file_data
from fleetgen.tune.measure import Load, Trial, trial_fleet
from fleetgen.tune.session import TuneOptions, _refuse_unmatched, candidates_for, refuse
from fleetgen.tune.verdict import BASELINE
from tests.unit.tune._helpers import QWEN, _two_class_fleet, fleet_file, setting

# --- refusals, before anything starts ----------------------------------------------------------------------


def _options(tmp_path: Path, **kw: Any) -> TuneOptions:
    load = Load(tmp_path / "p.jsonl", JobFile(), kw.pop("lengths", None), 10.0, 10.0, kw.pop("accept", None))
    return TuneOptions(load, 60.0, kw.pop("out", tmp_path / "t.toml"), tmp_path / "scratch", **kw)


def test_tune_refuses_what_it_must_each_with_its_fix(tmp_path: Path) -> None:
    path = _two_class_fleet(tmp_path)
    fleet = Fleet.load(path)
    refuse(fleet, _options(tmp_path))  # nothing wrong
    cases = [
        (fleet, _options(tmp_path, out=path), "is the fleet file itself"),
        (fleet, _options(tmp_path, keep_chosen=True, accept=3.0), "never leaves one running"),
    ]
    dummy = fleet.file.model_copy(
        update={"engine": fleet.file.engine.model_copy(update={"args": {"load-format": "dummy"}})}
    )
    cases.append((Fleet(path, dummy, fleet.engine), _options(tmp_path), "--output-lengths"))
    forced = fleet.file.model_copy(
        update={"engine": fleet.file.engine.model_copy(update={"env": {"SGLANG_SIMULATE_ACC_LEN": "3"}})}
    )
    cases.append((Fleet(path, forced, fleet.engine), _options(tmp_path), "--simulate-accept-length"))
    for which, opts, needle in cases:
        with pytest.raises(ConfigError) as exc:
            refuse(which, opts)
        assert needle in exc.value.message + exc.value.fix
    update_state(path, put=[InstanceRecord("rtx-0", "rtx", (0,), 30000, 1, 1, "l", "s", "x", "t")])
    with pytest.raises(ConfigError, match="deployed") as deployed:
        refuse(fleet, _options(tmp_path))
    assert "fleetgen down" in deployed.value.fix


def _h200_plan() -> Any:
    fleet = fleet_file([{"name": "a", "gpus": [0], "gpu_memory_gib": 140.4}])
    job = JobShape(
        LengthStats.fixed(20),
        LengthStats(0, 1800.0, 1500, 4000, 5500, 6000),
        "given",
        False,
        6000,
        1,
        True,
        0.0,
        "test",
        True,
        10,
        10,
        0,
        20,
        1,
    )
    [plan] = plan_fleet(fleet, QWEN, {"a": facts_from_file(fleet.hosts[0])}, job=job).instances
    return plan


H200_PLAN = _h200_plan()
OFFERED = candidates_for(H200_PLAN, allow_numerics=True)


def test_the_candidates_are_the_plans_the_files_own_first_numerics_only_when_allowed() -> None:
    plan = H200_PLAN
    strict = candidates_for(plan, allow_numerics=False)
    loose = candidates_for(plan, allow_numerics=True)
    assert strict[0].name == BASELINE and not any(s.numerics for s in strict)
    assert any(s.numerics for s in loose) and [s for s in loose if not s.numerics] == strict
    assert max(s.running for s in strict) > strict[0].running  # the plan offers more than the defaults
    # the same settings as the plan's, but the best of each kind (speculative or not) straight after the
    # user's own: a budget that ends early has measured speculation both ways
    offered = [s for s in plan.job.settings if not s.numerics] if plan.job else []
    assert sorted(s.name for s in strict) == sorted(s.name for s in offered)
    kinds = {s.is_spec for s in offered[1:]}
    assert len(kinds) == 2 and {s.is_spec for s in strict[1:3]} == kinds
    for kind in kinds:
        assert next(s for s in strict[1:] if s.is_spec == kind) == next(
            s for s in offered[1:] if s.is_spec == kind
        )


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from([s.name for s in OFFERED[1:]]), min_size=1))
def test_only_measures_the_named_candidates_in_tunes_order_the_files_own_first(names: set[str]) -> None:
    kept = candidates_for(H200_PLAN, allow_numerics=True, only=sorted(names))
    assert kept[0].name == BASELINE
    assert sorted(s.name for s in kept[1:]) == sorted(names)
    for spec in (
        True,
        False,
    ):  # each kind in the plan's order (the best of each kind leads, as without --only)
        assert [s for s in kept if s.is_spec == spec] == [
            s for s in OFFERED if s.is_spec == spec and s in kept
        ]
    assert {s.is_spec for s in kept[1:3]} == {s.is_spec for s in kept[1:]}


def test_only_takes_shell_patterns_and_refuses_one_that_names_no_candidate(tmp_path: Path) -> None:
    spec = candidates_for(H200_PLAN, allow_numerics=False, only=["*mtp*"])
    assert len(spec) > 1 and all(s.is_spec for s in spec[1:])
    assert {s.name for s in spec[1:]} == {s.name for s in OFFERED[1:] if "mtp" in s.name and not s.numerics}
    cls = GpuClass(140, 1)
    opts = _options(tmp_path, only=("*mtp*", "no-radix-9999"))
    pending = {cls: candidates_for(H200_PLAN, allow_numerics=False, only=opts.only)}
    with pytest.raises(ConfigError, match="no-radix-9999") as exc:
        _refuse_unmatched(opts, {cls: [H200_PLAN]}, pending)
    assert "*mtp*" not in exc.value.message and OFFERED[1].name in exc.value.message
    _refuse_unmatched(replace(opts, only=("*mtp*",)), {cls: [H200_PLAN]}, pending)


def test_a_forced_accept_length_goes_on_tunes_own_server_only_which_up_refuses_unless_told(
    tmp_path: Path,
) -> None:
    path = _two_class_fleet(tmp_path)
    fleet = Fleet.load(path)
    inst = fleet.file.instances()[0]
    mtp = setting("mtp", 8, **{"speculative-algorithm": "EAGLE"})
    load = replace(_options(tmp_path).load, simulate_accept_length=3.0)
    trial = Trial(GpuClass(96, 1), mtp, inst, 0, tmp_path / "trial")
    derived = trial_fleet(file_data(fleet.file, path), fleet.engine, trial, load)
    assert derived.file.engine.env["SGLANG_SIMULATE_ACC_LEN"] == "3"
    assert derived.path == tmp_path / "trial" / "fleet.toml" and Fleet.load(derived.path).file == derived.file
    with pytest.raises(ConfigError, match="SGLANG_SIMULATE_ACC_LEN=3"):
        refuse_simulated_acceptance(derived)  # what `up` does unless tune tells it
    refuse_simulated_acceptance(fleet)  # the user's file: untouched
    plain = trial_fleet(
        file_data(fleet.file, path),
        fleet.engine,
        replace(trial, folder=tmp_path / "t2"),
        replace(load, simulate_accept_length=None),
    )
    assert "SGLANG_SIMULATE_ACC_LEN" not in plain.file.engine.env
