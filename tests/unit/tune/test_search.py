"""`fleetgen tune`'s pure parts: GPU classes, rounds under a budget, narrowing in, verdicts and the job's
time, the tuned fleet file (its comments, and `plan` reading it back with the winners' argv), per-host
engine_args (plan and up decide the same argv), the engines' decode rate and forced acceptance."""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.config import FleetFile, JobFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.state import InstanceRecord, update_state
from fleetgen.deploy.wanted import build_command, build_wanted, refuse_simulated_acceptance
from fleetgen.engines import format_args, get_engine
from fleetgen.errors import ConfigError
from fleetgen.generate.rows import forced_length
from fleetgen.modelcard import load_model_shape
from fleetgen.plan import GpuFacts, HostFacts, facts_from_file, plan_fleet
from fleetgen.plan.job import JobShape, LengthStats, LogNormalLengths
from fleetgen.plan.types import Setting
from fleetgen.tune.classes import GpuClass, group_by_class
from fleetgen.tune.fleetfile import candidate_data, file_data, split_args, tuned_text
from fleetgen.tune.measure import Load, Trial, trial_fleet
from fleetgen.tune.search import Budget, family_key, narrow, next_round
from fleetgen.tune.session import TuneOptions, candidates_for, refuse
from fleetgen.tune.verdict import BASELINE, Measured, finish_time, ratio, winner

MODELS = Path(__file__).parents[2] / "data" / "models"
QWEN = load_model_shape(MODELS / "qwen3.6-27b")
GIB = 1 << 30
H200 = GpuClass(140, 1)


def setting(name: str, running: int, **args: Any) -> Setting:
    return Setting(name, "", args, {}, running, "", 0)


def measured(s: Setting, tps: float | None, cls: GpuClass = H200, error: str = "") -> Measured:
    return Measured(
        cls, s, "h-0", "2026-12-03 10:00 UTC", decode_tps=tps, running=float(s.running), error=error
    )


def fleet_file(hosts: list[dict[str, Any]], args: dict[str, Any] | None = None, tp: int = 1) -> FleetFile:
    engine = {"kind": "sglang", "model": "/m", "tp": tp, "args": args or {}, "version": "0.5.23"}
    return FleetFile.model_validate({"engine": engine, "hosts": hosts})


# --- GPU classes -------------------------------------------------------------------------------------------


def test_instances_group_by_gpu_memory_and_tp_largest_first() -> None:
    fleet = fleet_file(
        [
            {"name": "small", "gpus": [0, 1], "gpu_memory_gib": 95.6},
            {"name": "big", "gpus": [0], "gpu_memory_gib": 179.1},
            {"name": "small2", "gpus": [3], "gpu_memory_gib": 95.6},
        ]
    )
    facts = {h.name: facts_from_file(h) for h in fleet.hosts}
    plan = plan_fleet(fleet, QWEN, facts)
    groups = group_by_class(plan.instances, facts)
    assert [(c.name, [p.instance for p in ps]) for c, ps in groups.items()] == [
        ("179 GiB", ["big-0"]),
        ("96 GiB", ["small-0", "small-1", "small2-0"]),
    ]


def test_a_host_mixing_gpu_classes_is_refused_naming_it() -> None:
    fleet = fleet_file([{"name": "mixed", "gpus": [0, 1]}])
    gpus = (GpuFacts(0, 96 * GIB, 96 * GIB, True), GpuFacts(1, 180 * GIB, 180 * GIB, True))
    facts = {"mixed": HostFacts("mixed", gpus)}
    plan = plan_fleet(fleet, QWEN, facts)
    with pytest.raises(ConfigError, match="mixed mixes GPU classes") as exc:
        group_by_class(plan.instances, facts)
    assert "split mixed into two" in exc.value.fix


def test_an_unknown_gpu_memory_is_refused_with_the_fix() -> None:
    fleet = fleet_file([{"name": "dark", "gpus": [0]}])
    facts = {"dark": HostFacts("dark")}
    plan = plan_fleet(fleet, QWEN, facts)
    with pytest.raises(ConfigError, match="not known") as exc:
        group_by_class(plan.instances, facts)
    assert "gpu_memory_gib" in exc.value.fix


# --- rounds under a budget ---------------------------------------------------------------------------------


def test_the_first_round_always_runs_and_a_round_that_cannot_finish_never_starts() -> None:
    pending = [setting(f"c{i}", 10 * i + 10) for i in range(5)]
    budget = Budget(100.0)
    assert next_round(pending, 2, Budget(0.001)) == pending[:2]  # the baseline is always measured
    budget = budget.after_round(40.0)
    assert next_round(pending, 2, budget) == pending[:2]  # 40 s more ends at 80 ≤ 100
    budget = budget.after_round(30.0)  # 70 used; the longest round (40) would end at 110
    assert budget.left_s == 30.0 and next_round(pending, 2, budget) == []


@given(
    st.floats(1, 10_000),
    st.lists(st.floats(0.1, 5_000), min_size=1, max_size=30),
)
def test_rounds_started_under_the_budget_end_within_it_at_the_longest_rounds_pace(
    total: float, rounds: list[float]
) -> None:
    """Invariant: every round after the first starts only if the longest round so far fits what is left;
    so if no round runs longer than the longest before it, the tune ends within the budget."""
    budget, longest = Budget(total), 0.0
    for took in rounds:
        if not next_round([setting("c", 1)], 1, budget):
            break
        started_with = budget
        budget = budget.after_round(took)
        if started_with.round_s is not None and took <= longest:
            assert budget.used_s <= total + 1e-6
        longest = max(longest, took)


# --- narrowing ---------------------------------------------------------------------------------------------


def _resize(best: Setting, n: int) -> Setting | None:
    """Sizes up to 400 fit (a stand-in for the plan's arithmetic)."""
    if n > 400:
        return None
    args = {**best.args, "max-running-requests": n}
    return Setting(f"{best.name.split('@')[0]}@{n}", "", args, {}, n, "", 0)


FAMILY = family_key(["max-running-requests"])


def test_narrowing_goes_halfway_to_the_measured_neighbours_of_the_same_family() -> None:
    tried = [
        setting("a0", 64, **{"max-running-requests": 64, "disable-radix-cache": True}),
        setting("a", 128, **{"max-running-requests": 128, "disable-radix-cache": True}),
        setting("b", 256, **{"max-running-requests": 256, "disable-radix-cache": True}),
        setting("c", 384, **{"max-running-requests": 384, "disable-radix-cache": True}),
        setting("other", 300, **{"max-running-requests": 300}),  # another family: no neighbour
    ]
    assert [s.running for s in narrow(tried[2], tried, FAMILY, _resize)] == [192, 320]


def test_narrowing_steps_out_a_quarter_where_nothing_was_measured_and_stops_at_what_fits() -> None:
    best = setting("a", 320, **{"max-running-requests": 320})
    assert [s.running for s in narrow(best, [best], FAMILY, _resize)] == [240, 400]
    best = setting("a", 360, **{"max-running-requests": 360})
    assert [s.running for s in narrow(best, [best], FAMILY, _resize)] == [270]  # 450 does not fit


def test_narrowing_stops_when_the_step_is_small() -> None:
    tried = [setting(str(n), n, **{"max-running-requests": n}) for n in (100, 104, 108)]
    assert narrow(tried[1], tried, FAMILY, _resize) == []


def test_a_cuda_graph_batch_sized_to_the_running_requests_is_not_part_of_the_family() -> None:
    a = setting("a", 256, **{"max-running-requests": 256, "cuda-graph-max-bs-decode": 256})
    b = setting("b", 192, **{"max-running-requests": 192, "cuda-graph-max-bs-decode": 192})
    assert FAMILY(a) == FAMILY(b)
    other = setting("c", 256, **{"max-running-requests": 256, "cuda-graph-max-bs-decode": 512})
    assert FAMILY(a) != FAMILY(other)  # a graph batch of its own is the setting's own choice


# --- verdicts and the job's time ---------------------------------------------------------------------------


def test_the_winner_is_the_fastest_per_gpu_and_errors_never_win() -> None:
    base, big = setting("as-written", 44), setting("no-radix-256", 256)
    results = [measured(base, 1460.0), measured(big, 3008.0), measured(setting("x", 9), None, error="OOM")]
    assert winner(results) is results[1]
    assert ratio(results[1], results[0]) == pytest.approx(3008 / 1460)
    assert ratio(results[2], results[0]) is None


def test_a_tp2_instances_rate_is_per_gpu() -> None:
    tp2 = GpuClass(96, 2)
    m = measured(setting("a", 10), 2000.0, tp2)
    assert m.decode_tps_per_gpu == 1000.0


def test_the_jobs_time_is_its_tokens_over_the_fleets_summed_rate() -> None:
    small, big = GpuClass(96, 1), GpuClass(179, 1)
    f = finish_time(902_087, 1818.0, {small: 4, big: 7}, {small: 1500.0, big: 3000.0})
    assert f.tokens_per_s == 4 * 1500 + 7 * 3000
    assert f.seconds == pytest.approx(902_087 * 1818 / 27_000)
    assert f.text() == "902,087 completions × 1,818 tokens: 16.9 h on 4 × 96 GiB + 7 × 179 GiB"
    assert math.isinf(finish_time(10, 1.0, {small: 1}, {}).seconds)


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


def _two_class_fleet(tmp_path: Path) -> Path:
    text = f"""
[engine]
kind = "sglang"
version = "0.5.23"
model = "/m"
model_config = "{MODELS / "qwen3.6-27b"}"

[engine.args]
mem-fraction-static = 0.85
reasoning-parser = "qwen3"

[[hosts]]
name = "rtx"
gpus = [0, 1]
gpu_memory_gib = 95.6

[[hosts]]
name = "b200"
gpus = [0]
gpu_memory_gib = 179.1
"""
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


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


# --- engines: decode rate over a window, forced acceptance -------------------------------------------------


def test_sglangs_decode_rate_is_its_gauge_averaged_not_its_finish_time_counter() -> None:
    """0.5.15 adds a request's tokens to generation_tokens_total when it finishes: the counter says 0 over a
    window where nothing finished, the gauge says what was decoded."""
    window = [(0.0, {"sglang:gen_throughput": 999.0, "sglang:generation_tokens_total": 5.0})] + [
        (float(t), {"sglang:gen_throughput": 1000.0 + 100 * t, "sglang:generation_tokens_total": 5.0})
        for t in (1, 2, 3)
    ]
    assert get_engine("sglang").decode_rate(window) == pytest.approx(1200.0)
    assert get_engine("sglang").decode_rate(window[:1]) is None


def test_vllms_decode_rate_is_its_counters_rise_over_the_window() -> None:
    window = [
        (10.0, {"vllm:generation_tokens_total": 100.0}),
        (14.0, {"vllm:generation_tokens_total": 900.0}),
    ]
    assert get_engine("vllm").decode_rate(window) == 200.0
    restarted = [window[1], (18.0, {"vllm:generation_tokens_total": 10.0})]
    assert get_engine("vllm").decode_rate(restarted) is None


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        ("sglang", {"speculative-algorithm": "EAGLE"}),
        ("vllm", {"speculative-config": '{"method": "mtp", "num_speculative_tokens": 3}'}),
    ],
)
def test_forcing_an_accept_length_is_what_up_refuses(kind: str, args: dict[str, Any]) -> None:
    engine = get_engine(kind)
    forced = engine.with_simulated_acceptance(args, {"A": "b"}, 3.0)
    assert forced is not None
    new_args, env = forced
    assert engine.simulated_acceptance(format_args(args), {"A": "b"}) == ()
    assert engine.simulated_acceptance(format_args(new_args), env) != ()
    assert env["A"] == "b"


def test_forced_lengths_are_the_distributions_and_the_same_for_a_request_everywhere() -> None:
    spec = LogNormalLengths.parse("mean=300,min=50,max=1000")
    keys = [random.Random(i).getrandbits(63) for i in range(2000)]
    bodies = [forced_length(spec, k) for k in keys]
    assert all(b["ignore_eos"] is True and 50 <= b["max_tokens"] <= 1000 for b in bodies)
    assert [forced_length(spec, k) for k in keys] == bodies
    assert abs(sum(b["max_tokens"] for b in bodies) / len(bodies) - 300) < 30


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


def test_the_candidates_are_the_plans_the_files_own_first_numerics_only_when_allowed() -> None:
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
