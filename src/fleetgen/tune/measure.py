"""One candidate measured on one instance: launched through `up` as a fleet of its own (tune's folder, its
own port), loaded with the job's own requests through `run`'s dispatcher, read at steady state, stopped.

Steady state: with forced lengths the first batch starts as requests already under way (`generate.forced`:
the job's steady mix of contexts, not an empty batch); the batch is ready when `tune.steady` says so (full,
or held by the engine at a bound of its own; one that never settles within the warm-up is an error, not
ranked), then a fixed window is read. The requests in flight are what `run` keeps on a
server by default (`generate.dispatch.in_flight_for` its admitted running requests, `offered_running`):
enough queued that a finished request is replaced at once, few enough that the queue is not the measurement.

A candidate whose engine dies (its metrics stop answering, or the load stops) is an error in the engine's own
words, read from its log on its host (`FleetLinks.death` → `deploy.death`), never the transport error its dead
port leaves; one the engine held far below what it admits over the whole window is an error in its terms
(`tune.steady.held_below`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomli_w

from fleetgen.config import FleetFile, Instance, JobFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.fleetops import down, up
from fleetgen.deploy.readiness import Readiness
from fleetgen.engines import Engine
from fleetgen.errors import EngineDied, FleetgenError
from fleetgen.fleet.pool import FleetLinks, open_fleet
from fleetgen.generate.dispatch import in_flight_for
from fleetgen.generate.fleetlink import fleet_servers
from fleetgen.generate.forced import Filler
from fleetgen.generate.progress import Counters
from fleetgen.generate.runner import Job
from fleetgen.generate.work import JobOptions, RecordShape, RetryPolicy, SamplingParams
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import Scrape, Window, window_of
from fleetgen.plan.job import OutputLengths
from fleetgen.plan.types import Setting
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.fleetfile import candidate_data
from fleetgen.tune.steady import Fill, Sample, fill_verdict, held_below
from fleetgen.tune.verdict import Measured

SCRAPE_INTERVAL_S = 1.0
# How long a candidate that stopped answering is watched for its process to exit: SGLang's launcher sleeps 5 s
# after its scheduler died before it ends the process tree ("Sleeping 5 seconds before crash diagnostics").
DYING_S = 20.0
Say = Callable[[str], None]


@dataclass(frozen=True)
class Load:
    """What every candidate is measured with: the job's input and sampling, the lengths each request writes
    (None: the model's own), the window and the warm-up's cap, and a forced accept length (None: real)."""

    input_path: Path
    job_file: JobFile
    lengths: OutputLengths | None
    window_s: float
    warmup_max_s: float
    simulate_accept_length: float | None = None
    steady_start: bool = True  # with lengths: the first batch starts under way (`generate.forced`)
    # what stands for the part those requests wrote, counted with the model's tokenizer (`generate.forced`)
    filler: Filler = field(default_factory=Filler)


@dataclass(frozen=True)
class Trial:
    """One candidate on one instance of its class, in tune's folder `folder` (its fleet file and store)."""

    gpu_class: GpuClass
    setting: Setting
    instance: Instance
    slot: int
    folder: Path


def trial_fleet(base: dict[str, Any], engine: Engine, trial: Trial, load: Load) -> Fleet:
    """The candidate's own fleet file, written into its folder (for the record) and loaded from it; with a
    forced accept length, the engine's setting for it (every candidate: the fleet file's own settings may
    speculate too, and the setting does nothing without speculation)."""
    args, env = dict(trial.setting.args), dict(trial.setting.env)
    if load.simulate_accept_length is not None:  # inert without speculation (the file's own may have it)
        forced = engine.with_simulated_acceptance(args, env, load.simulate_accept_length)
        if forced is not None:
            args, env = forced
    data = candidate_data(base, trial.instance, trial.slot, args, env)
    trial.folder.mkdir(parents=True, exist_ok=True)
    path = trial.folder / "fleet.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return Fleet(path, FleetFile.model_validate(data), engine)


async def measure(base: dict[str, Any], engine: Engine, trial: Trial, load: Load, say: Say) -> Measured:
    """Launch, load, read, stop: what one candidate did (its error, if it did not start or died)."""
    fleet = trial_fleet(base, engine, trial, load)
    name = f"{trial.gpu_class.name} {trial.setting.name}"
    failed = Measured(trial.gpu_class, trial.setting, trial.instance.name, _now())
    try:
        say(f"{name}: starting on {trial.instance.name} (GPU {','.join(map(str, trial.instance.gpus))})")
        forced = load.simulate_accept_length is not None
        outs = await up(fleet, allow_simulated_acceptance=forced)
        errors = [o.error for o in outs if o.error is not None]
        if errors or not outs:
            why = errors[0].message if errors else "up started nothing"
            say(f"{name}: did not start: {why}")
            return _failed(failed, why)
        measured = await _load_and_read(fleet, engine, trial, load, say)
        tps, running = measured.decode_tps_per_gpu, measured.running or 0
        said = f"{name}: {tps:,.0f} decode tok/s per GPU at {running:.0f} running"
        say(said if not measured.error else f"{said}, not ranked: {measured.error}")
        return measured
    except FleetgenError as exc:
        say(f"{name}: failed: {exc.message}")
        return _failed(failed, exc.message)
    finally:
        with contextlib.suppress(FleetgenError):  # never leave a tune server running: down says what it did
            for out in await down(fleet):
                if out.error is not None:
                    say(f"{name}: stopping {out.instance} failed: {out.error.message}")


def _failed(m: Measured, why: str) -> Measured:
    return Measured(m.gpu_class, m.setting, m.instance, m.at, error=why)


async def _load_and_read(fleet: Fleet, engine: Engine, trial: Trial, load: Load, say: Say) -> Measured:
    async with open_fleet(fleet) as links:
        at_start = await links.read_all()
        [link] = at_start
        admitted = offered_running(link.max_running_requests, trial.setting.running)
        clients = in_flight_for(admitted)
        job = Job(
            _options(trial, load, clients, admitted),
            fleet_servers(fleet, links, at_start, restart_dead=False),
        )
        running = asyncio.create_task(job.run())
        try:
            async with EngineClient(link.url, api_key=links.secret) as client:
                expected = expected_running(link.max_running_requests, trial.setting.running)
                window, rate, notes, error = await _steady_window(
                    engine, client, (admitted, expected), load, running, job.counters
                )
        except FleetgenError as exc:  # its metrics stopped answering: the engine's own words where it died
            raise EngineDied(await _in_its_words(links, link.name, exc.message), fix=exc.fix) from exc
        finally:
            job.stop()
            job.stop()  # the window is read: abandon what is in flight
            stopped = await _job_error(running)
        if stopped:  # the load stopped on its own: its servers gone, or every request refused
            stopped = await _in_its_words(links, link.name, stopped)
    return Measured(
        trial.gpu_class,
        trial.setting,
        trial.instance.name,
        _now(),
        admitted=link.max_running_requests,
        running=window.running,
        decode_tps=window.decode_tps,
        completions_per_s=rate,
        accept_length=window.accept_length,
        window_s=window.seconds,
        clients=clients,
        notes=notes,
        error=stopped or error,
    )


async def _in_its_words(links: FleetLinks, name: str, why: str) -> str:
    """`why` a candidate failed, or where its engine died, that death in the engine's own words and its fix
    (`deploy.death`): never the transport error a dead engine leaves ("GET …/metrics failed:
    ClientConnectorError" on the H100, where SGLang's scheduler had died of CUDA OOM)."""
    deadline = time.monotonic() + DYING_S
    try:
        link = await links.read_one(name)
        while link.readiness is Readiness.WAITING and time.monotonic() < deadline:  # alive, not answering
            await asyncio.sleep(SCRAPE_INTERVAL_S)
            link = await links.read_one(name)
        died = await links.death(name) if link.readiness is Readiness.DOWN else None
    except FleetgenError:  # its host went away too: `why` is all there is
        return why
    return f"the engine died: {died.text()}; fix: {died.fix}" if died else why


async def _job_error(job: asyncio.Task[Any]) -> str:
    """Why the load's job stopped on its own, in the server's words where it quotes them (every request
    refused, the server gone): the candidate's error. Empty where it ran until tune stopped it."""
    try:
        await job
    except FleetgenError as exc:
        said = "; ".join(f"{k}: {v}" for k, v in exc.context.items() if k in ("server says", "last error"))
        return f"the load stopped: {exc.message}" + (f" ({said})" if said else "")
    return ""


def offered_running(engine_says: int | None, planned: int) -> int:
    """The running requests the load offers a candidate (and starts under way): what its engine says it
    admits, or the plan's running requests for the job where that is more. vLLM says its concurrency for
    requests of max-model-len, a floor: the job's shorter ones run more at once (H200: 105 said, the job's
    plan 244), and a load sized on the floor measured the client's cap (141 in flight, 141 running)."""
    return max(engine_says or 0, planned)


def _options(trial: Trial, load: Load, clients: int, admitted: int) -> JobOptions:
    """`run`'s options for the job's input and sampling, into the trial's own scratch store; with forced
    lengths, a batch's worth of requests start under way (`generate.forced`)."""
    return JobOptions(
        input_path=load.input_path,
        out_dir=trial.folder / "store",
        params=SamplingParams.of(load.job_file),
        shape=RecordShape.of(load.job_file),
        concurrency=clients,
        policy=RetryPolicy(max_retries=1, dead_timeout_s=30.0),
        request_timeout_s=load.job_file.request_timeout_s,
        wait_ready_s=30.0,
        forced_lengths=load.lengths,
        under_way=admitted if load.steady_start else 0,
        filler=load.filler,
    )


def expected_running(engine_says: int | None, planned: int) -> int:
    """The running requests both the plan and the engine expect of a candidate: the fewer of the two (vLLM-CPU
    says max-num-seqs 512 where its KV pool runs the job's 125, as planned); the window is held against it."""
    return min(n for n in (engine_says, planned) if n) if engine_says or planned else 0


async def _steady_window(
    engine: Engine,
    client: EngineClient,
    batch: tuple[int, int],
    load: Load,
    job: asyncio.Task[Any],
    counters: Counters,
) -> tuple[Window, float, tuple[str, ...], str]:
    """Wait until the batch is ready (`tune.steady`), then read `load.window_s`: the engine's window, the
    dispatcher's completions/s over it, notes on what was not as it should be, and an error where the
    batch never settled or the engine held it far below what plan and engine expect (`batch`: what the load
    offers, what both expect); the window is read all the same, for the record."""
    admitted, expected = batch
    fill = await _warm_up(engine, client, admitted, load, job)
    notes = [fill.note] if fill.note else []
    done_before = counters.results
    scrapes: list[Scrape] = [await client.metrics()]
    while scrapes[-1].at - scrapes[0].at < load.window_s and not job.done():
        await asyncio.sleep(SCRAPE_INTERVAL_S)
        scrapes.append(await client.metrics())
    if job.done():
        notes.append("the input ran out before the window ended: give a larger input (or --window)")
    window = window_of(engine, scrapes)
    rate = (counters.results - done_before) / window.seconds if window.seconds > 0 else 0.0
    queued = sum(s.samples.get(engine.metrics.queued, 0.0) for s in scrapes) / len(scrapes)
    ran = [s.samples[engine.metrics.running] for s in scrapes if engine.metrics.running in s.samples]
    held = held_below(max(ran, default=None), queued, expected, window.decode_tps)
    return window, rate, tuple(notes), fill.error or held


async def _warm_up(
    engine: Engine, client: EngineClient, admitted: int, load: Load, job: asyncio.Task[Any]
) -> Fill:
    """Sample the engine's running and queued requests until `fill_verdict` decides; a job that ends first
    (its input done, or stopped: `_job_error` says why) left no batch to measure."""
    samples: list[Sample] = []
    while not job.done():
        got = (await client.metrics()).samples
        running, queued = got.get(engine.metrics.running, 0.0), got.get(engine.metrics.queued, 0.0)
        samples.append(Sample(time.monotonic(), running, queued))
        fill = fill_verdict(samples, admitted, load.warmup_max_s)
        if not fill.waiting:
            return fill
        await asyncio.sleep(SCRAPE_INTERVAL_S)
    return Fill(error="the input ran out before the batch filled: no steady rate; give a larger input")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
