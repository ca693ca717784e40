"""The Ray fixture's teardown (tests/fixtures/ray.py `LocalRay.stop_nodes`): every node is signalled before
any is waited for, so nodes that take their time on SIGTERM (Ray drains up to 30 s) stop side by side.

Stand-ins for `ray start --block` (Ray itself is not needed to check the order): shell processes in sessions
of their own that, on SIGTERM, note when they got it, take a moment, and note when they end."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.fixtures.ray import LocalRay

SLOW_TO_STOP = (
    'trap \'date +%s%N > "$0.got"; sleep 1; date +%s%N > "$0.ended"; exit 0\' TERM; '
    'touch "$0.up"; while :; do sleep 0.05; done'
)


def test_every_node_is_signalled_before_any_is_waited_for(tmp_path: Path) -> None:
    cluster = LocalRay(tmp_path)
    marks = [tmp_path / f"node{k}" for k in range(3)]
    for mark in marks:
        proc = subprocess.Popen(["bash", "-c", SLOW_TO_STOP, str(mark)], start_new_session=True)
        cluster.nodes.append(proc)
    while not all(Path(f"{mark}.up").exists() for mark in marks):  # each trap in place before the signal
        time.sleep(0.01)
    cluster.stop_nodes([0, 1, 2])
    assert all(node.returncode == 0 for node in cluster.nodes)  # each stopped on SIGTERM, not killed
    got = [int(Path(f"{mark}.got").read_text()) for mark in marks]
    ended = [int(Path(f"{mark}.ended").read_text()) for mark in marks]
    assert max(got) < min(ended)  # the last signalled before the first had stopped
