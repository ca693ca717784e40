"""The generation job: input → dispatcher → writer → store, resumable and exactly once.

Life of a run:
1. open the store (the folder's lock); resolve the model from the ready endpoints (none ready: wait a bounded
   time for one; those not ready join once healthy, health.py); refuse changed sampling params;
2. decide what is not done: normal runs skip committed keys (from the resume position on), `--retry-errors`
   picks the error rows, `--redo-truncated` the truncated rows;
3. stream the input; each (record, sample) not done becomes a `Work` for the dispatcher; bad lines become
   `inputs_bad` rows;
4. results and final errors queue for the writer, which commits them in batches; only then are they counted;
5. stop: done, Ctrl-C (drain, or abandon on a second Ctrl-C) or FleetDown → flush the writer, close.
A kill -9 at any point loses only uncommitted in-flight work, which the rerun does again.

`Job(options, servers)`: `JobOptions` (its own settings, built once by the CLI from the job file and flags)
and `JobServers` (what it runs on: endpoints, key, engine kind, description, and what it may ask of a
fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleetgen.deploy.readiness import Judgement, Readiness
from fleetgen.errors import JobError, ParamsMismatch
from fleetgen.fleet.pool import Link
from fleetgen.generate import rows
from fleetgen.generate.dispatch import Dispatcher
from fleetgen.generate.forced import ForcedLengths
from fleetgen.generate.health import Endpoint, HealthMonitor, OnDead, served_models
from fleetgen.generate.heap import frozen_heap
from fleetgen.generate.ledger import jobmeta
from fleetgen.generate.ledger.intake import Intake
from fleetgen.generate.ledger.jobmeta import JobMeta
from fleetgen.generate.ledger.store import Batch, Counts, Store, Written
from fleetgen.generate.ledger.writer import StoreWriter
from fleetgen.generate.modelfiles import MAX_LENGTH, keep_model
from fleetgen.generate.progress import (
    Counters,
    EndpointProgress,
    Progress,
    RateMeter,
    RunEnd,
    Summary,
)
from fleetgen.generate.scrape import MetricsScraper
from fleetgen.generate.source import count_records
from fleetgen.generate.work import JobOptions, Work
from fleetgen.http.client import EngineClient
from fleetgen.http.request import ChatRequests

OnProgress = Callable[[Progress], None]


@dataclass(frozen=True)
class JobServers:
    """What a job runs on and may ask of it, built once by `generate.fleetlink` (a fleet file, or bare URLs).

    `endpoints`: (name, base URL); `describe`: the store's meta of what generates the data; `engine_kind`:
    whose /metrics names to read (None: try every engine's). `not_ready`: the instances not ready at the
    start (name → readiness, why); they start drained and join once `read_one` (re-reading one instance from
    its host) says they are ready. DOWN ones have no process: `on_dead` (`--restart-dead`) restarts them
    through the deploy layer. Bare URLs have endpoints and a description only.
    """

    endpoints: list[tuple[str, str]] = field(default_factory=list)
    describe: Mapping[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    engine_kind: str | None = None
    not_ready: Mapping[str, tuple[Readiness, str]] = field(default_factory=dict)
    read_one: Callable[[str], Awaitable[Link]] | None = None
    on_dead: OnDead | None = None
    # requests in flight per endpoint (name → cap), from what its engine admits; others: the job's concurrency
    caps: Mapping[str, int] = field(default_factory=dict)
    # endpoints whose engine runs past its figure (vLLM without max-num-seqs): their caps are filled
    fill: frozenset[str] = frozenset()


@dataclass
class Job:
    """One run of a job on a fleet. `await Job(options, fleet).run(on_progress)`; `stop()` is Ctrl-C."""

    options: JobOptions
    servers: JobServers
    counters: Counters = field(default_factory=Counters)
    _stops: int = 0
    _abandon: asyncio.Event = field(default_factory=asyncio.Event)
    _dispatcher: Dispatcher | None = None
    _total: int | None = None
    _meta: JobMeta | None = None
    _started: float = 0.0  # monotonic
    _stack: contextlib.AsyncExitStack | None = None
    _filled: set[str] = field(default_factory=set)  # endpoints whose caps are filled (`JobServers.fill`)

    def stop(self) -> None:
        """First call: take no new work, let in-flight requests finish. Second: abandon them now."""
        self._stops += 1
        if self._dispatcher is not None:
            self._dispatcher.stop()
        if self._stops > 1:
            self._abandon.set()

    async def run(self, on_progress: OnProgress | None = None) -> Summary:
        """Run the job to the end (or until stopped); raise FleetDown / JobError when it cannot go on."""
        opts = self.options
        store = Store.open(opts.out_dir)
        self._filled = set(self.servers.fill)
        try:
            intake = Intake.open(store, opts)
            async with contextlib.AsyncExitStack() as stack:
                stack.enter_context(frozen_heap())  # the ledger's maps, loaded, out of the collector's way
                self._stack = stack
                endpoints = []
                for (
                    name,
                    url,
                ) in self.servers.endpoints:  # one not READY waits for the HealthMonitor to admit it
                    readiness, why = self.servers.not_ready.get(name, (Readiness.READY, ""))
                    cap = self.servers.caps.get(name, opts.concurrency)
                    client = await self._client(url)
                    endpoints.append(Endpoint(name, client, cap, readiness, last_error=why))
                admit = self._admit if self.servers.read_one is not None else None
                monitor = HealthMonitor(endpoints, opts.policy, on_dead=self.servers.on_dead, admit=admit)
                stack.push_async_callback(monitor.close)
                return await self._run(store, intake, monitor, on_progress)
        finally:
            store.close()

    async def _client(self, url: str) -> EngineClient:
        """A client for one endpoint, closed with the job. Its pool has no limit of its own: the endpoint's
        cap (which `Dispatcher.fill` may raise) is what bounds its requests in flight."""
        assert self._stack is not None
        opts = self.options
        client = EngineClient(
            url,
            max_connections=0,
            timeout_s=opts.request_timeout_s,
            api_key=self.servers.api_key,
        )
        return await self._stack.enter_async_context(client)

    async def _admit(self, endpoint: Endpoint) -> Judgement:
        """Re-read the endpoint's instance from its host: may it take work? Its reason goes to the view."""
        assert self.servers.read_one is not None
        link = await self.servers.read_one(endpoint.name)
        if link.url and link.url.rstrip("/") != endpoint.client.base_url:
            endpoint.client = await self._client(link.url)  # its host was unreachable at the start
        if link.running_is_floor:  # a late one whose engine runs past its figure: filled as the others
            self._filled.add(endpoint.name)
        if link.readiness is not Readiness.READY:
            endpoint.last_error = link.problem
        return Judgement(link.readiness, link.problem)

    async def _run(
        self, store: Store, intake: Intake, monitor: HealthMonitor, on_progress: OnProgress | None
    ) -> Summary:
        opts = self.options
        self._started = time.monotonic()
        model = await self._resolve_model(monitor, on_progress)
        if model is None:  # stopped (Ctrl-C) while waiting for a first ready server
            return rows.summary(store, "stopped", "", self.counters, time.monotonic() - self._started, {})
        builder = rows.RowBuilder(model, self._check_params(store, model), intake.input_index)
        intake.plan(store, self.counters)
        describe = dict(self.servers.describe)
        if opts.model_dir is not None:
            describe.update(keep_model(store, opts.model_dir, opts.params.thinking))
        if opts.max_length is not None:
            describe[MAX_LENGTH] = opts.max_length
        was_finished = jobmeta.begin(store, describe)
        meta = self._meta = JobMeta(intake.resume, opts.params.samples, intake.tracker, set(intake.verdicts))
        writer = StoreWriter(
            store,
            lambda batch, written: self._committed(batch, written, meta),
            meta=meta.current,
            replace_truncated=opts.mode == "redo_truncated",
        )
        scraper = MetricsScraper(  # URLs as they are each round: a late host joins with one of its own
            lambda: [(e.name, e.client.base_url) for e in monitor.endpoints],
            self.servers.engine_kind,
            interval_s=opts.metrics_interval_s,
            api_key=self.servers.api_key,
        )
        requests = ChatRequests(
            model, opts.params.max_tokens, opts.params.sampling, return_token_ids=opts.forced_lengths is None
        )
        forced = (
            None
            if opts.forced_lengths is None
            else ForcedLengths(opts.forced_lengths, opts.under_way, opts.filler)
        )

        def body(work: Work) -> dict[str, Any]:
            out = requests.body(work.messages_for_next_turn(), work.sample)
            return out if forced is None else forced.apply(out, work.key)

        dispatcher = Dispatcher(
            monitor,
            body,
            lambda ep, work, t0, dt: writer.put(builder.result(ep, work, t0, dt)),
            lambda ep, work, exc: writer.put(builder.error(ep, work, exc)),
        )
        by_name = {e.name: e for e in monitor.endpoints}
        scraper.on_engine = monitor.progressed  # the hung guard's evidence of progress
        scraper.on_load = lambda name, running, waiting: (
            dispatcher.fill(by_name[name], running, waiting) if name in self._filled else None
        )
        status = await self._execute(dispatcher, writer, scraper, intake, on_progress)
        if status == "complete" and store.counts().results == 0:
            status = "failed"  # nothing useful: every item an error or bad input, or no input at all
        if status == "complete" and (opts.mode == "normal" or was_finished):
            jobmeta.finish(store)  # a re-run pass finishes only a job that had finished before
        elapsed = time.monotonic() - self._started
        per_endpoint = {e.name: e.completions for e in monitor.endpoints}
        return rows.summary(store, status, model, self.counters, elapsed, per_endpoint)

    async def _execute(
        self,
        dispatcher: Dispatcher,
        writer: StoreWriter,
        scraper: MetricsScraper,
        intake: Intake,
        on_progress: OnProgress | None,
    ) -> RunEnd:
        """Run the dispatcher with the writer, counter, ticker and scraper beside it; always flush."""
        self._dispatcher = dispatcher
        if self._stops:
            dispatcher.stop()
        writer_task = asyncio.create_task(writer.run())
        writer_task.add_done_callback(lambda _t: dispatcher.stop())  # a failed writer stops the job
        counting = asyncio.create_task(self._count_total(intake.wanted))
        beside = [
            counting,
            asyncio.create_task(self._tick(dispatcher, writer, scraper, on_progress)),
            asyncio.create_task(scraper.run()),
        ]
        status: RunEnd = "complete"
        try:
            await dispatcher.run(intake.work(writer.put))
            if self._stops:
                status = "stopped"
                await self._drain(dispatcher)
            else:  # the input is read to its end: its count (a faster read of it) is due, for the last frame
                await counting
        finally:
            await dispatcher.abandon()  # whatever is still in flight is dropped, never half-written
            for task in beside:
                task.cancel()
            writer.put(*rows.series_rows(dispatcher.endpoints, scraper.latest))  # the end
            writer.close()
            await asyncio.gather(writer_task, *beside, return_exceptions=True)
            if on_progress is not None:  # the last frame shows the job's averages, not the last window's
                elapsed = max(time.monotonic() - self._started, 1e-9)
                c = self.counters
                rates = {e.name: e.completions / elapsed for e in dispatcher.endpoints}
                final = self._snapshot(
                    dispatcher, (c.results + c.errors) / elapsed, c.output_tokens / elapsed, rates
                )
                on_progress(dataclasses.replace(final, is_final=True, waiting_s=None))
        writer_task.result()  # a failed writer's error is the job's
        return status

    async def _drain(self, dispatcher: Dispatcher) -> None:
        """Wait for the requests in flight to finish, or for a second stop (`_execute` then abandons them)."""
        drain = asyncio.create_task(dispatcher.drain())
        abandon = asyncio.create_task(self._abandon.wait())
        await asyncio.wait({drain, abandon}, return_when=asyncio.FIRST_COMPLETED)
        drain.cancel()
        abandon.cancel()

    async def _resolve_model(self, monitor: HealthMonitor, on_progress: OnProgress | None) -> str | None:
        """The served model, from the first ready endpoints (None: stopped while waiting for one)."""

        def on_wait(remaining_s: float) -> None:  # no counts yet: each server's state and why
            if on_progress is not None:
                states = [EndpointProgress.of(e) for e in monitor.endpoints]
                elapsed = time.monotonic() - self._started
                on_progress(Progress(elapsed_s=elapsed, endpoints=states, waiting_s=remaining_s))

        infos = await served_models(
            monitor,
            wait_s=self.options.wait_ready_s,
            tick_s=self.options.progress_interval_s,
            on_wait=on_wait,
            is_stopped=lambda: bool(self._stops),
        )
        if not infos:
            return None
        wanted = self.options.params.model
        served = set(infos.values())
        if wanted is None and len(served) > 1:
            raise JobError(
                f"the endpoints serve different models: {infos}",
                fix="point the job at one model's servers, or set `model` in the job file",
            )
        return wanted or served.pop()

    def _check_params(self, store: Store, model: str) -> str:
        params = dataclasses.replace(self.options.params, model=model)
        stored = store.get_meta("params")
        ignore = frozenset({"max_tokens"}) if self.options.mode == "redo_truncated" else frozenset()
        if stored is not None and not self.options.force_params:
            diffs = params.differences(orjson.loads(stored), ignore=ignore)
            if diffs:
                raise ParamsMismatch(
                    f"{self.options.out_dir} was generated with other sampling parameters",
                    context={"differences": "\n".join(diffs)},
                    fix="rerun with the original parameters, use another -o folder, or pass --force-params "
                    "to mix them (each row records its params hash)",
                )
        if stored is None or (self.options.force_params and self.options.mode == "normal"):
            store.set_meta({"params": params.to_json()})
        return params.digest

    def _committed(self, batch: Batch, written: Written, meta: JobMeta) -> None:
        c = self.counters
        c.results += written.results
        c.errors += written.errors
        c.bad += written.bad
        for result in batch.results:
            c.output_tokens += result.completion_tokens or 0
            c.truncated += result.is_truncated
        meta.committed(batch)

    async def _count_total(self, wanted: set[int] | None) -> None:
        if wanted is not None:
            self._total = len(wanted)
            return
        num = await asyncio.to_thread(count_records, self.options.input_path, self.options.split)
        self._total = num * self.options.params.samples
        if self._meta is not None:
            self._meta.num_records = num  # the writer stores the total with its next batch

    async def _tick(
        self,
        dispatcher: Dispatcher,
        writer: StoreWriter,
        scraper: MetricsScraper,
        on_progress: OnProgress | None,
    ) -> None:
        done_meter, token_meter = RateMeter(), RateMeter()
        meters = {e.name: RateMeter() for e in dispatcher.endpoints}
        last_series = time.monotonic()
        writer.put(*rows.series_rows(dispatcher.endpoints, scraper.latest))  # the start
        while True:
            await asyncio.sleep(self.options.progress_interval_s)
            c = self.counters
            rate, tok_rate = done_meter.add(c.results + c.errors), token_meter.add(c.output_tokens)
            rates = {e.name: meters[e.name].add(e.completions) for e in dispatcher.endpoints}
            if on_progress is not None:
                snapshot = self._snapshot(dispatcher, rate, tok_rate, rates, predicts=done_meter.is_measured)
                on_progress(snapshot)
            if time.monotonic() - last_series >= self.options.series_interval_s:
                last_series = time.monotonic()
                writer.put(*rows.series_rows(dispatcher.endpoints, scraper.latest))

    def _snapshot(
        self,
        dispatcher: Dispatcher,
        rate: float,
        tok_rate: float,
        rates: Mapping[str, float],
        *,
        predicts: bool = False,
    ) -> Progress:
        """The progress view's snapshot: what the store holds (what it held at the start and this run's
        committed rows), never a count of this run alone; an ETA once `rate` `predicts` (a whole window)."""
        c, total, samples = self.counters, self._total, self.options.params.samples
        before = c.before if self.options.mode == "normal" else Counts()
        bad = before.bad_inputs + c.bad
        done = before.results + before.errors + c.results + c.errors + bad * samples
        can_predict = predicts and total is not None and rate > 0 and total >= done
        eta = (total - done) / rate if can_predict and total is not None else None
        return Progress(
            done=done,
            total=total,
            completions_per_s=rate,
            output_tokens_per_s=tok_rate,
            eta_s=eta,
            errors=before.errors + c.errors,
            truncated=before.truncated + c.truncated,
            bad_inputs=bad,
            in_flight=dispatcher.num_in_flight,
            retrying=dispatcher.num_retrying,
            elapsed_s=time.monotonic() - self._started,
            stopping=bool(self._stops),
            endpoints=[EndpointProgress.of(e, rates.get(e.name, 0.0)) for e in dispatcher.endpoints],
            waiting_s=dispatcher.wait_left_s,  # every server gone: the wait left
        )
