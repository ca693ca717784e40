"""`fleet.status`: what `status --json` carries for an instance; pure code."""

from __future__ import annotations

import json

import pytest

from fleetgen.deploy.readiness import Readiness
from fleetgen.fleet.status import InstanceStatus

# The keys the deploy issue asks `status --json` to carry (tests/integration/deploy/test_vllm.py reuses them).
STATUS_JSON_KEYS = frozenset(
    {
        "instance",
        "host",
        "gpus",
        "pid",
        "port",
        "url",
        "ready",
        "drift",
        "uptime_s",
        "running",
        "queued",
        "gen_tokens_per_s",
        "spec_accept_length",
    }
)


def test_status_json_has_the_issue_keys() -> None:
    assert set(InstanceStatus("h0-0", "h0", (0,), 30000).to_json()) >= STATUS_JSON_KEYS


@pytest.mark.parametrize("readiness", list(Readiness))
def test_status_json_says_ready_true_only_for_ready_whatever_else_the_status_holds(
    readiness: Readiness,
) -> None:
    """`status --json` is a machine interface: `ready` stays a JSON boolean (no enum leaks into it), the
    problem text stays beside it, and the keys are the same for every readiness."""
    status = InstanceStatus(
        "h0-0", "h0", (0,), 30000, readiness=readiness, problem="not running", drift=["x"]
    )
    out = json.loads(json.dumps(status.to_json()))
    assert out["ready"] is (readiness is Readiness.READY) and out["problem"] == "not running"
    assert "readiness" not in out and set(out) == set(InstanceStatus("a", "b", (), 1).to_json())
