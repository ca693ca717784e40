"""`fleetgen up --job JOB --input INPUT`: up's plan is the plan for the job, end to end on `fleetgen.sim`.

Real processes on this machine, launched by `up` on a `local` host (the fleet of tune's tests: two simulated
H200s with the engine's defaults, Qwen3.6-27B's shape, whose admission the sim caps by SGLang's own Mamba
arithmetic). What must hold, with a job of distinct prompts and long outputs:
- before launching, up prints the `job-throughput` warning and the plan's best setting, then launches the
  flags as written all the same;
- after verifying each instance, a line per instance gives the job's running requests planned (what
  `plan --job --json` plans for the same inputs) next to what the engine admits (its own /server_info);
- without --job, up prints what it printed before --job existed: up --job's output less its job lines;
- `restart --job` plans and reports alike.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from fleetgen.engines import get_engine
from tests.fixtures.ports import free_port
from tests.integration.tune.test_sim import fleetgen_cli, job_input, sim_fleet

LENGTHS = "mean=3000,min=500,max=8000"
JOB_LINE = re.compile(r"^\s+for this job running\s+planned\s+([\d,]+)\s+admitted\s+([\d,]+)", re.MULTILINE)
INSTANCE = re.compile(r"^✓ (\S+) \(h\) \w+, pid \d+, (http://\S+),", re.MULTILINE)


def _blocks(stdout: str) -> dict[str, tuple[str, str]]:
    """Each instance's URL and the lines up printed for it (its ✓ line up to the next one)."""
    starts = list(INSTANCE.finditer(stdout))
    ends = [m.start() for m in starts[1:]] + [len(stdout)]
    return {m.group(1): (m.group(2), stdout[m.start() : end]) for m, end in zip(starts, ends, strict=True)}


def _admitted_by_engine(url: str) -> int | None:
    with urllib.request.urlopen(url + "/server_info", timeout=30) as reply:
        return get_engine("sglang").max_running_from_info(json.loads(reply.read()))


def _without_job_lines(stdout: str) -> str:
    """up --job's stdout less what --job adds (the plan for the job before the ✓ lines, one line per
    instance after), and the seconds each took (they differ run to run)."""
    first = INSTANCE.search(stdout)
    assert first is not None, stdout
    kept = [line for line in stdout[first.start() :].splitlines() if not JOB_LINE.match(line + "\n")]
    return re.sub(r", \d+\.\ds", "", "\n".join(kept))


def test_up_for_a_job_warns_before_launching_and_says_planned_vs_admitted_per_instance(
    tmp_path: Path,
) -> None:
    fleet = sim_fleet(tmp_path, free_port())
    prompts, _ = job_input(tmp_path)
    job = tmp_path / "long.toml"
    job.write_text("max_tokens = 8000\ntemperature = 0.6\n")
    for_job = ("--job", str(job), "--input", str(prompts), "--output-lengths", LENGTHS)
    try:
        started = fleetgen_cli("up", "-f", str(fleet))
        assert started.returncode == 0, started.stderr[-3000:]
        plain = fleetgen_cli("up", "-f", str(fleet))  # the same servers, left as they are
        assert plain.returncode == 0, plain.stderr[-3000:]
        job_words = ("for this job", "[job-throughput]")
        assert not any(w in o.stdout + o.stderr for w in job_words for o in (started, plain))

        done = fleetgen_cli("up", "-f", str(fleet), *for_job)
        assert done.returncode == 0, done.stderr[-3000:]
        planned = fleetgen_cli("plan", "-f", str(fleet), "--json", *for_job)
        assert planned.returncode == 0, planned.stderr[-3000:]
        plans = {p["instance"]: p for p in json.loads(planned.stdout)["instances"]}

        out = done.stdout
        # before launching: the warning, the user's flags and the best setting, in plan's words
        launch = INSTANCE.search(out)
        assert launch is not None, out
        before = out[: launch.start()]
        assert "[job-throughput]" in before and "as-written" in before
        for p in plans.values():
            settings = p["job"]["settings"]
            best = max((s for s in settings if not s["numerics"]), key=lambda s: s["running"])
            assert best["running"] > settings[0]["running"] and best["name"] in before
        # after verifying: per instance, planned for the job (plan's number) vs what the engine admits
        blocks = _blocks(out)
        assert set(blocks) == set(plans)
        for name, (url, block) in blocks.items():
            [(shown_planned, shown_admitted)] = JOB_LINE.findall(block)
            assert int(shown_planned.replace(",", "")) == plans[name]["job"]["settings"][0]["running"]
            assert int(shown_admitted.replace(",", "")) == _admitted_by_engine(url)
        # without --job: what up --job prints less its job lines
        assert _without_job_lines(out) == _without_job_lines(plain.stdout)
        # restart --job: the same plan for the job, the instance started again
        first = sorted(plans)[0]
        again = fleetgen_cli("restart", "-f", str(fleet), "--only", first, *for_job)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "[job-throughput]" in again.stdout and set(_blocks(again.stdout)) == {first}
        [(shown_again, _)] = JOB_LINE.findall(_blocks(again.stdout)[first][1])
        pids = [re.findall(r"pid (\d+)", b[first][1])[0] for b in (blocks, _blocks(again.stdout))]
        assert pids[0] != pids[1]  # started again, not left as it was
        assert int(shown_again.replace(",", "")) == plans[first]["job"]["settings"][0]["running"]
    finally:
        fleetgen_cli("down", "-f", str(fleet))


def test_up_with_a_job_and_no_input_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    fleet = sim_fleet(tmp_path, port)
    job = tmp_path / "job.toml"
    job.write_text("max_tokens = 100\n")
    refused = fleetgen_cli("up", "-f", str(fleet), "--job", str(job))
    assert refused.returncode == 2 and "--input" in refused.stderr
    assert not (tmp_path / ".fleetgen").exists()
