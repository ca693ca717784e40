"""The Slurm fixture's reading of its node and queue (tests/fixtures/slurmstate.py): idle only when Slurm
would start a job on the node now. The lines are the test cluster's own (Debian's slurm-wlm 22.05.8,
`scontrol show node -d -o`), captured as a job ran, was cancelled, and the node was drained and resumed."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.slurmstate import QueuedJob, not_idle_report, parse_node, parse_queue

_HEAD = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc={cpus} CPUEfctv=16 CPUTot=16 CPULoad=2.42 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:4 GresDrain=N/A GresUsed={gres} "
    "NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44-fc-v1272 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=16000 AllocMem=0 FreeMem=12562 Sockets=16 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 "
    "Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-12-06T23:47:24 "
    "SlurmdStartTime=2026-12-07T12:31:26 LastBusyTime=2026-12-07T12:31:27 "
    "CfgTRES=cpu=16,mem=16000M,billing=16 AllocTRES={tres} CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
KILL_FAILED = " Reason=Kill task failed [root@2026-12-07T12:31:30]"


def captured(state: str, gres: str = "gpu:0", cpus: int = 0, reason: str = "") -> str:
    tres = f"cpu={cpus}" if cpus else ""
    return _HEAD.format(state=state, gres=gres, cpus=cpus, tres=tres) + reason


# (line, idle?) as the cluster printed them: a job cancelled is COMPLETING with its GPUs already released
# (GresUsed=gpu:0) while Slurm starts nothing on the node; a resumed node reads NOT_RESPONDING a moment.
CAPTURED = [
    (captured("IDLE"), True),
    (captured("IDLE+PLANNED"), True),  # the backfill scheduler planned a pending job here: nothing held
    (captured("MIXED", "gpu:2", 1), False),
    (captured("MIXED", "gpu:4", 1), False),
    (captured("IDLE+COMPLETING"), False),
    (captured("MIXED+DRAIN", "gpu:2", 1, KILL_FAILED), False),
    (captured("IDLE+DRAIN", reason=KILL_FAILED), False),
    (captured("IDLE+NOT_RESPONDING"), False),
]


def test_the_node_is_idle_only_when_slurm_would_start_a_job_on_it_now() -> None:
    assert [parse_node(line).is_idle for line, _ in CAPTURED] == [idle for _, idle in CAPTURED]


def test_a_drained_nodes_reason_is_read_whole_and_every_field_beside_a_spaced_value() -> None:
    node = parse_node(captured("IDLE+DRAIN", reason=KILL_FAILED))
    assert node.reason == "Kill task failed [root@2026-12-07T12:31:30]"
    assert (node.name, node.state, node.gres_used, node.num_cpus_allocated) == (
        "vm",
        "IDLE+DRAIN",
        "gpu:0",
        0,
    )
    assert "Reason=Kill task failed" in node.describe() and "State=IDLE+DRAIN" in node.describe()
    busy = parse_node(captured("MIXED", "gpu:2", 1))
    assert (busy.gres_used, busy.num_gres_used, busy.num_cpus_allocated, busy.reason) == ("gpu:2", 2, 1, "")


_GRES_NAME = st.sampled_from(["gpu", "gpu:a100", "gpu:h100_80gb", "mps", "shard"])
_IDX = st.sampled_from(["", "(IDX:N/A)", "(IDX:0)", "(IDX:0-1,3)", "(IDX:0,2)"])


@given(st.lists(st.tuples(_GRES_NAME, st.integers(0, 64), _IDX), min_size=1, max_size=4))
def test_every_generic_resource_a_job_holds_is_counted(entries: list[tuple[str, int, str]]) -> None:
    """GresUsed as Slurm spells it for typed GPUs and several kinds: `gpu:a100:1(IDX:0-1,3),mps:0`."""
    gres = ",".join(f"{name}:{count}{idx}" for name, count, idx in entries)
    node = parse_node(captured("IDLE", gres))
    assert node.num_gres_used == sum(count for _, count, _ in entries)
    assert node.is_idle == (node.num_gres_used == 0)


_FLAGS = ["COMPLETING", "DRAIN", "PLANNED", "NOT_RESPONDING", "MAINTENANCE", "RESERVED", "REBOOT_REQUESTED"]


@given(
    st.sampled_from(["IDLE", "IDLE*", "MIXED", "ALLOCATED", "DOWN", "DOWN*", "UNKNOWN", "FUTURE"]),
    st.lists(st.sampled_from(_FLAGS), unique=True, max_size=3),
)
def test_idle_is_the_idle_state_with_no_flag_but_a_plan(base: str, flags: list[str]) -> None:
    node = parse_node(captured("+".join([base, *flags])))
    assert node.is_idle == (base == "IDLE" and set(flags) <= {"PLANNED"})


def test_something_that_is_no_node_line_is_refused_not_read_as_idle() -> None:
    for text in ["", "Node vm not found", "slurm_load_node error: Unable to contact slurm controller"]:
        try:
            parse_node(text)
        except ValueError as refused:
            assert repr(text) in str(refused)
        else:
            raise AssertionError(f"{text!r} read as a node")


_NAME = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30)


@given(
    st.lists(st.tuples(st.integers(1, 10**6), st.sampled_from(["PENDING", "RUNNING", "COMPLETING"]), _NAME))
)
def test_every_queued_job_is_read_whatever_its_name_holds(jobs: list[tuple[int, str, str]]) -> None:
    """A job name may hold `|`, spaces, `=`: squeue prints it last, so it is read whole."""
    text = "".join(f"{job_id}|{state}|None|{name}\n" for job_id, state, name in jobs) + "\n"
    read = parse_queue(text)
    assert [(j.job_id, j.state, j.name) for j in read] == [(str(i), s, n) for i, s, n in jobs]
    assert [j.is_ending for j in read] == [s == "COMPLETING" for _, s, _ in jobs]


def test_the_report_names_every_job_its_state_and_the_test_that_submitted_it() -> None:
    listed = [QueuedJob("12", "COMPLETING", "None", "fleetgen-ab12-slurm-0")]
    cancelled = [QueuedJob("7", "RUNNING", "None", "wrap"), QueuedJob("9", "PENDING", "Resources", "probe")]
    node = parse_node(captured("IDLE+COMPLETING")).describe()
    report = not_idle_report(
        node, listed, cancelled, {"12": "tests/a.py::test_up", "7": "tests/b.py::test_x"}
    )
    assert "State=IDLE+COMPLETING" in report
    for says in [
        "job 12 'fleetgen-ab12-slurm-0' COMPLETING (None), submitted by tests/a.py::test_up",
        "job 7 'wrap' RUNNING (None), submitted by tests/b.py::test_x",
        "job 9 'probe' PENDING (Resources), submitted by",
    ]:
        assert says in report
    assert re.search(r"still listed: job 12 .*cancelled before this one: job 7 .*; job 9 ", report)
    assert "Fix:" in report
