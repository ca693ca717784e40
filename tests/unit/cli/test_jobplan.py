"""What `plan` and `up` share for a job (`cli/jobplan.py`): the options read one way, the engine's admitted
running requests read from up's verification, the per-instance line `up --job` prints, and the plan for the
job printed before up launches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.cli.jobplan import admission_line, admitted_of, print_job_plans, read_job_shape_for
from fleetgen.deploy.verify import CapacityRow
from fleetgen.errors import ConfigError
from fleetgen.plan import InstancePlan, Issue
from fleetgen.plan.types import JobPlan, Memory, Setting
from tests.fixtures.localfleet import local_fleet


def setting(name: str, running: int, numerics: str = "") -> Setting:
    return Setting(
        name,
        "" if name == "as-written" else f"--{name}",
        {},
        {},
        running,
        f"bound {name}",
        0,
        numerics=numerics,
    )


def instance(name: str, job: JobPlan | None) -> InstancePlan:
    return InstancePlan(name, "h", (0,), 30000, "sglang", "sglang-0.5.23", Memory(), ("x",), {}, job=job)


async def test_no_job_options_is_no_job_and_one_without_the_other_is_refused(tmp_path: Path) -> None:
    fleet = local_fleet(tmp_path, model="/models/m")
    assert await read_job_shape_for(fleet, None, None, None, offline=True) is None
    assert await read_job_shape_for(fleet, None, None, "mean=10,min=1,max=20", offline=True) is None
    for job_file, input_path in ((tmp_path / "job.toml", None), (None, tmp_path / "in.jsonl")):
        with pytest.raises(ConfigError) as refused:
            await read_job_shape_for(fleet, job_file, input_path, None, offline=True)
        assert "--job" in refused.value.message and "--input" in refused.value.message


def test_admitted_is_the_engines_own_max_running_requests() -> None:
    rows = [CapacityRow("kv_tokens", 100.0, 120.0), CapacityRow("max_running_requests", 43.0, 44.0)]
    assert admitted_of(rows) == 44
    assert admitted_of([CapacityRow("max_running_requests", 43.0, None)]) is None
    assert admitted_of([CapacityRow("kv_tokens", 100.0, 44.0)]) is None


runnings = st.integers(min_value=1, max_value=5000)


@given(
    mine=runnings,
    others=st.lists(st.tuples(runnings, st.booleans()), max_size=4),
    admitted=st.none() | runnings,
)
def test_the_admission_line_says_planned_vs_admitted_and_what_the_job_could_run(
    mine: int, others: list[tuple[int, bool]], admitted: int | None
) -> None:
    own = setting("as-written", mine)
    offered = [setting(f"s{i}", n, "fp8" if changes else "") for i, (n, changes) in enumerate(others)]
    job = JobPlan((own, *offered))
    line = admission_line(job, admitted)
    found = re.search(r"planned\s+([\d,]+)\s+admitted\s+(\S+)", line)
    assert found is not None, line
    assert int(found.group(1).replace(",", "")) == mine
    assert found.group(2) == ("—" if admitted is None else f"{admitted:,}")
    assert own.bound in line
    assert ("fewer than planned" in line) == (admitted is not None and admitted < mine)
    best = job.best
    assert (f"{best.name} plans {best.running:,}" in line) == (best.running > mine)
    assert not any(f"{s.name} plans" in line for s in offered if s.numerics)  # never one changing numbers


def test_before_launching_each_job_plan_is_printed_once_with_its_warning_and_best(
    capsys: pytest.CaptureFixture[str],
) -> None:
    warning = Issue("job-throughput", "43 running requests for this job", "use --no-radix")
    idle = JobPlan(
        (setting("as-written", 43), setting("no-radix-200", 200), setting("fp8", 280, "fp8")), warning
    )
    full = JobPlan((setting("as-written", 200),))
    plans = [instance("a-0", idle), instance("a-1", idle), instance("b-0", full), instance("c-0", None)]
    print_job_plans(plans)
    out, err = capsys.readouterr()
    assert out.count("[job-throughput] 43 running requests for this job") == 1 and "use --no-radix" in out
    assert "a-0, a-1" in out and "b-0" in out
    # a-0/a-1: the flags up launches and the best; b-0's own are its best; fp8 changes the numbers
    assert re.findall(r"^│ (\S+)", out, re.MULTILINE) == ["as-written", "no-radix-200", "as-written"]
    assert "c-0: not planned for this job" in err and "c-0" not in out


def test_no_plan_at_all_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    """No model shape read: up planned nothing, and says the job went unplanned rather than nothing."""
    print_job_plans([])
    out, err = capsys.readouterr()
    assert out == "" and "not planned for this job: the model's shape could not be read" in err
