"""The suite on parallel workers (pytest-xdist, as scripts/check runs it): tests that use one heavy thing run
on ONE worker, which starts it once, and say why; the others spread.

A real pytest with two real xdist workers runs a small suite under this repository's own grouping
(tests/conftest.py): stand-ins for the heavy session fixtures (the real ones start Slurm and vLLM) record
which worker started them and which worker ran each test.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.fixtures import skip_or_fail

ROOT = Path(__file__).parents[3]

CONFTEST = """
import os
from pathlib import Path

import pytest

from tests.conftest import pytest_collection_modifyitems, pytest_configure  # the grouping under test

LOG = Path(os.environ["WORKERS_LOG"])


def record(line: str) -> None:
    with LOG.open("a") as fh:
        fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {line}\\n")


@pytest.fixture(scope="session")
def slurm_cluster():
    record("started slurm_cluster")


@pytest.fixture(scope="session")
def netns_hosts():
    record("started netns_hosts")


@pytest.fixture(scope="session")
def vllm_server():
    record("started vllm_server")
"""

TESTS = """
import pytest

from conftest import record


def _group(request):  # the group its `one_worker` mark names, when the mark says why ("-": no mark)
    mark = request.node.get_closest_marker("one_worker")
    return mark.args[0] if mark and mark.kwargs["reason"] else "-"


@pytest.mark.parametrize("k", range(6))
def test_slurm(slurm_cluster, request, k):
    record(f"ran slurm {_group(request)}")


@pytest.mark.parametrize("k", range(6))
def test_netns(netns_hosts, request, k):
    record(f"ran netns {_group(request)}")


@pytest.mark.vllm
@pytest.mark.parametrize("k", range(6))
def test_vllm(slurm_cluster, request, k):  # vLLM through Slurm: a vLLM test
    record(f"ran vllm {_group(request)}")


@pytest.mark.vllm
@pytest.mark.parametrize("k", range(6))
def test_vllm_server(vllm_server, request, k):  # the session server's tests: their own group
    record(f"ran served {_group(request)}")


@pytest.mark.specforge
@pytest.mark.parametrize("k", range(6))
def test_specforge(request, k):  # SpecForge's reader: one per worker, so one worker
    record(f"ran specforge {_group(request)}")


@pytest.mark.parametrize("k", range(12))
def test_free(request, k):
    record(f"ran free {_group(request)}")
"""


def test_tests_sharing_a_heavy_fixture_run_on_one_worker_which_starts_it_once(tmp_path: Path) -> None:
    if importlib.util.find_spec("xdist") is None:
        skip_or_fail("pytest-xdist", "pip install -e '.[dev]' (a dev dependency: scripts/install-deps.sh)")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(TESTS)
    log = tmp_path / "workers.log"
    env = {"WORKERS_LOG": str(log), "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran: dict[str, set[str]] = defaultdict(set)
    started: dict[str, list[str]] = defaultdict(list)
    groups: dict[str, set[str]] = defaultdict(set)
    for worker, verb, what, *why in (line.split() for line in log.read_text().splitlines()):
        if verb == "started":
            started[what].append(worker)
        else:
            ran[what].add(worker)
            groups[what].update(why)
    assert {w for ws in ran.values() for w in ws} <= {"gw0", "gw1"}, ran
    for kind, group in (
        ("slurm", "slurm"),
        ("netns", "netns"),
        ("vllm", "vllm-cpu"),
        ("served", "vllm-server"),
        ("specforge", "specforge"),
    ):
        assert len(ran[kind]) == 1, (kind, ran)  # one worker for the whole group
        assert groups[kind] == {group}, (kind, groups)  # each says why, in its `one_worker` mark
    # a session fixture starts once per worker that uses it: once for the Slurm group, once for vLLM's
    assert len(started["slurm_cluster"]) == len(ran["slurm"] | ran["vllm"]) and started["netns_hosts"] == [
        *ran["netns"]
    ]
    assert started["vllm_server"] == [*ran["served"]]
    assert groups["free"] == {"-"}
