"""`status`'s probe request (`fleet.status.probe_failure`): what it holds against an instance whose /health
answers 200 (issue 29 item 8: a server answering 500 to every request was "ready yes", no problem).

Servers are stand-ins (tests/fixtures/standin.py says why): each fault comes on cue. The judgement of what
the probe saw (`Seen.failing` → DOWN) is `deploy.readiness`'s, tested in tests/unit/deploy/test_readiness.py.
"""

from __future__ import annotations

import pytest

from fleetgen.deploy.readiness import Readiness, Seen, decide
from fleetgen.fleet.status import probe_failure
from fleetgen.http.client import EngineClient
from tests.fixtures.standin import StandIn, serve


@pytest.mark.parametrize("status", [500, 503])
async def test_a_server_answering_errors_to_every_request_is_down_with_its_reply_quoted(status: int) -> None:
    async with serve(StandIn(reject_all_with=status)) as a, EngineClient(a.url, timeout_s=5) as client:
        why = await probe_failure(client, idle=False)
    assert why.startswith(f"HTTP {status}") and "rejected" in why
    readiness, problem = decide(Seen(is_alive=True, is_healthy=True, failing=why))
    assert readiness is Readiness.DOWN and why in problem


async def test_a_server_that_answers_or_refuses_the_request_itself_takes_work() -> None:
    """An answer, or a 4xx (the server works; it refuses that request), holds nothing against it."""
    async with serve(StandIn()) as a, EngineClient(a.url, timeout_s=5) as client:
        assert await probe_failure(client, idle=True) == ""
    async with serve(StandIn(reject_all_with=400)) as a, EngineClient(a.url, timeout_s=5) as client:
        assert await probe_failure(client, idle=True) == ""


async def test_a_slow_answer_counts_against_an_idle_engine_only() -> None:
    """No answer in time: a stall where its engine queues nothing (health 200, nothing generated:
    sgl-project/sglang#30314), merely busy where it queues requests ahead of the probe."""
    async with serve(StandIn(delay_s=30.0)) as a, EngineClient(a.url, timeout_s=60) as client:
        assert await probe_failure(client, idle=False, timeout_s=0.2) == ""
        why = await probe_failure(client, idle=True, timeout_s=0.2)
    assert "no answer to a probe request within 0.2 s" in why


async def test_an_unreachable_server_is_a_failure() -> None:
    async with EngineClient("http://127.0.0.1:9", timeout_s=5) as nowhere:
        assert "127.0.0.1:9" in await probe_failure(nowhere, idle=False)
