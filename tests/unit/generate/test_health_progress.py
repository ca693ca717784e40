"""Health that tells the truth (issue 29 items 7 and 8): a hang judged by progress, not by /health; a drained
server back only once a probe request is answered; a new job not held up by a server that does not answer.

Servers are stand-ins (see tests/fixtures/standin.py for why): each fault (a /health that answers 200 or
never, a /v1/models that answers late or names another model, every request answered 500) comes on cue.
Filed under `generate/health.py`, with `generate/scrape.py`'s evidence of progress (`on_engine`, wired by
`generate/runner.py`) and `http/client.py`'s probe request as the monitor uses them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetgen.deploy.readiness import Readiness
from fleetgen.generate.health import NOT_ANSWERED, Endpoint, HealthMonitor, served_models
from fleetgen.generate.progress import Progress
from fleetgen.generate.scrape import MetricsScraper
from fleetgen.http.client import EngineClient
from fleetgen.http.request import PROBE_PROMPT
from tests import fixtures
from tests.fixtures.jobs import FAST, new_job, write_jsonl
from tests.fixtures.standin import StandIn, serve

QUICK = dataclasses.replace(FAST, probe_interval_s=0.02, probe_interval_max_s=0.02, dead_timeout_s=5.0)
HANG_GUARD_S = 30.0  # only against a hung test; never asserted as a speed


async def until(condition: Callable[[], bool]) -> None:
    """Return once `condition()` holds (what a stand-in or the monitor does on its own clock)."""
    await fixtures.until(condition, timeout_s=HANG_GUARD_S, poll_s=0.01)


@pytest.mark.parametrize("health_hangs", [False, True], ids=["health-200", "health-hangs"])
async def test_an_endpoint_whose_engine_stands_still_is_hung_whatever_its_health_says(
    health_hangs: bool,
) -> None:
    """A request in flight, its engine's samples read and none moving for `hung_after_s`: hung, whether its
    /health answers 200 (SGLang's stall, sgl-project/sglang#30314) or never. The guard asks /health nothing:
    it used to wait on it with a timeout as long as `--hung-after` again (issue 29 item 7: about twice)."""
    hung: list[str] = []
    standin = StandIn(health_hangs=health_hangs)
    policy = dataclasses.replace(QUICK, hung_after_s=0.2, health_timeout_s=3600.0)
    async with serve(standin) as a, EngineClient(a.url, max_connections=1, timeout_s=3600) as client:
        endpoint = Endpoint("s0", client, 1, in_flight=1, is_counted=True, progress_at=time.monotonic())
        monitor = HealthMonitor([endpoint], policy)
        monitor.on_hung = lambda e, why: hung.append(why)
        try:
            await until(lambda: bool(hung))
        finally:
            await monitor.close()
    assert standin.health_seen == 0
    assert "no progress for" in hung[0] and "1 requests in flight" in hung[0]
    assert "stand still" in hung[0] and "whatever /health says" in hung[0]


async def test_the_engine_s_samples_moving_are_progress_and_standing_still_is_none() -> None:
    """`progressed`: a read of the engine's samples makes progress count by them (`is_counted`); a move
    dates its progress from the read before (never back in time), a read with nothing moved dates nothing."""
    endpoint = Endpoint("s0", EngineClient("http://127.0.0.1:9"), 1, progress_at=100.0)
    other = Endpoint("s1", EngineClient("http://127.0.0.1:9"), 1, progress_at=100.0)
    monitor = HealthMonitor([endpoint, other], FAST)
    monitor.progressed("s0", None)
    assert endpoint.is_counted and endpoint.progress_at == 100.0
    monitor.progressed("s0", 150.0)
    assert endpoint.progress_at == 150.0
    monitor.progressed("s0", 120.0)  # a later read that moved since an older one: no step back
    assert endpoint.progress_at == 150.0
    assert not other.is_counted and other.progress_at == 100.0
    await monitor.close()


SGLANG_TEXT = """# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{model_name="m"}} {throughput}
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m"}} 500.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m"}} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="m"}} 0.0
"""


@pytest.mark.parametrize("kind", ["sglang", None], ids=["fleet", "bare-url"])
async def test_the_scraper_says_when_the_engine_moved_since_the_read_before(kind: str | None) -> None:
    """SGLang adds a request's tokens to its counter only when the request ends; its throughput gauge, set
    every few dozen decode steps, moves while a long generation runs. The first read has nothing to compare
    (None), an unchanged read says None, a changed gauge dates the move from the read before it."""
    standin = StandIn(metrics_text=SGLANG_TEXT.format(throughput=10.0))
    calls: list[tuple[str, float | None]] = []
    async with serve(standin) as a, EngineClient(a.url, max_connections=1, timeout_s=5) as client:
        scraper = MetricsScraper(lambda: [("s0", a.url)], kind, interval_s=1.0, api_key=None)
        scraper.on_engine = lambda name, since: calls.append((name, since))
        await scraper._scrape("s0", client)
        await scraper._scrape("s0", client)
        second_read = time.monotonic()
        standin.metrics_text = SGLANG_TEXT.format(throughput=12.5)
        await scraper._scrape("s0", client)
    assert [name for name, _ in calls] == ["s0"] * 3
    assert calls[0][1] is None and calls[1][1] is None
    moved = calls[2][1]
    assert moved is not None and moved <= second_read


async def test_a_server_without_the_engine_s_samples_never_counts_as_read() -> None:
    """/metrics without the samples that move (or none at all): no `on_engine`, so the hung guard falls
    back to /health there (a long generation answers nothing for minutes)."""
    standin = StandIn(metrics_text='# TYPE other_total counter\nother_total{a="b"} 1.0\n')
    calls: list[tuple[str, float | None]] = []
    async with serve(standin) as a, EngineClient(a.url, max_connections=1, timeout_s=5) as client:
        scraper = MetricsScraper(lambda: [("s0", a.url)], None, interval_s=1.0, api_key=None)
        scraper.on_engine = lambda name, since: calls.append((name, since))
        await scraper._scrape("s0", client)
        standin.metrics_text = None  # 404
        await scraper._scrape("s0", client)
    assert calls == []


async def test_a_drained_server_failing_every_request_stays_down_until_a_probe_request_is_answered() -> None:
    """/health answers 200 while every chat request gets 500 (issue 29 item 8: "ready again" every few
    seconds). Drained, it is probed by one-token chat requests: it stays DOWN, never READY in between, and
    comes back once one is answered; the why it went down stays its why meanwhile."""
    standin = StandIn(reject_all_with=500)
    became_ready: list[int] = []  # the probe requests it had seen when it came back
    async with serve(standin) as a, EngineClient(a.url, max_connections=1, timeout_s=5) as client:
        endpoint = Endpoint("s0", client, 1, Readiness.DOWN, last_error="HTTP 500: boom")
        monitor = HealthMonitor([endpoint], QUICK)
        monitor.model = "standin"
        monitor.on_ready = lambda: became_ready.append(standin.seen[PROBE_PROMPT])
        try:
            await until(lambda: standin.seen[PROBE_PROMPT] >= 10)
            assert endpoint.readiness is Readiness.DOWN and became_ready == []
            assert endpoint.last_error == "HTTP 500: boom"
            standin.reject_all_with = None
            await until(lambda: endpoint.readiness is Readiness.READY)
        finally:
            await monitor.close()
    assert len(became_ready) == 1 and became_ready[0] > 10
    probes = [b for b in standin.bodies if b["messages"][-1]["content"] == PROBE_PROMPT]
    assert {b["max_tokens"] for b in probes} == {1} and {b["model"] for b in probes} == {"standin"}


async def test_a_new_job_starts_with_the_first_server_to_answer_and_the_others_join_when_they_do() -> None:
    """s0 does not answer GET /v1/models (hung), s1 does, s2 answers late with another model. The job's
    model comes from s1 at once; s0 is WAITING (not holding the others up: it used to be asked first and
    waited on), then joins when it answers; s2 is DOWN and says which model it serves."""
    gates = [asyncio.Event(), None, asyncio.Event()]
    standins = [StandIn(models_gate=gates[0]), StandIn(), StandIn(models_gate=gates[2], model="other")]
    async with serve(standins[0]) as a, serve(standins[1]) as b, serve(standins[2]) as c:
        clients = [EngineClient(s.url, max_connections=1, timeout_s=3600) for s in (a, b, c)]
        for client in clients:
            await client.__aenter__()
        endpoints = [Endpoint(f"s{i}", client, 1) for i, client in enumerate(clients)]
        monitor = HealthMonitor(endpoints, QUICK)
        try:
            models = await asyncio.wait_for(
                served_models(
                    monitor, wait_s=5.0, tick_s=0.05, on_wait=lambda _: None, is_stopped=lambda: False
                ),
                HANG_GUARD_S,
            )
            assert models == {"s1": "standin"} and monitor.model == "standin"
            assert [e.readiness for e in endpoints] == [Readiness.WAITING, Readiness.READY, Readiness.WAITING]
            assert endpoints[0].last_error == NOT_ANSWERED
            joined: list[str] = []
            monitor.on_ready = lambda: joined.append("ready")
            for gate in (gates[0], gates[2]):
                assert gate is not None
                gate.set()
            await until(lambda: all(e.readiness is not Readiness.WAITING for e in endpoints))
        finally:
            await monitor.close()
            for client in clients:
                await client.__aexit__(None, None, None)
    assert endpoints[0].readiness is Readiness.READY and joined == ["ready"]
    assert endpoints[2].readiness is Readiness.DOWN and "'other'" in endpoints[2].last_error


async def test_a_job_drains_a_server_that_answers_health_but_generates_nothing(tmp_path: Path) -> None:
    """The whole chain in a job: s0 answers /health 200 and exports SGLang's samples, all standing still,
    while holding every request it gets (sgl-project/sglang#30314). The job's scraper reads them, the hung
    guard drains s0 and its requests go to s1: the job completes, and its view says why s0 is down (it used
    to ask /health, hear 200, and wait on s0's requests for ever)."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(20)])
    policy = dataclasses.replace(QUICK, hung_after_s=1.0)
    stalled = StandIn(metrics_text=SGLANG_TEXT.format(throughput=10.0), gate=asyncio.Event())
    views: list[Progress] = []
    async with serve(stalled) as a, serve(StandIn()) as b:
        job = new_job(tmp_path, prompts, [a.url, b.url], policy=policy, metrics_interval_s=0.05)
        summary = await asyncio.wait_for(job.run(views.append), HANG_GUARD_S)
    assert summary.results == 20 and stalled.in_flight == 0
    s0 = views[-1].endpoints[0]
    assert s0.readiness is Readiness.DOWN and "stand still" in s0.last_error
