"""`fleetgen bench` against the simulated SGLang server (real processes, real HTTP, no timing thresholds).

SGLang itself cannot run here (no GPU), so the sim stands in for it: it streams, reports usage, caps running
requests like SGLang and serves SGLang's speculative-decoding metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any, cast

import tomli_w

from fleetgen.bench.stats import BenchLoad, BenchTarget
from fleetgen.bench.sweep import PROBE_TOKENS, sweep
from fleetgen.config import JobFile
from fleetgen.dashboard import chromium, svg
from fleetgen.generate.work import SamplingParams
from fleetgen.http.request import REQUEST_FIELDS as OWN_FIELDS
from fleetgen.http.request import ChatRequests
from tests.fixtures.chromium import need_chromium, png_pixels
from tests.fixtures.sim import SimFactory

FLEETGEN = Path(sys.executable).parent / "fleetgen"
ROOT = Path(__file__).resolve().parents[3]


async def test_sweep_counts_every_request_and_token(sim_server: SimFactory) -> None:
    load = BenchLoad(input_len=32, output_len=16, concurrencies=(1, 4), rounds=2, min_requests=3)
    async with sim_server(reasoning_parser="qwen3", sim_decode_tps=2000) as (url, _):
        levels = await sweep([BenchTarget("i0", (url,))], load)
    assert [(r.concurrency, r.num_requests, r.num_failed) for r in levels] == [(1, 3, 0), (4, 8, 0)]
    for level in levels:
        assert level.output_tokens == level.num_requests * 16  # ignore_eos + max_tokens: exactly 16 each
        assert level.mean_input_tokens > 0
        assert level.ttft_s is not None and level.ttft_s.p50 > 0
        assert level.itl_s is not None  # several chunks per request at a finite decode speed
        assert level.accept_length is None  # no speculative decoding configured


async def _counters(url: str) -> dict[str, float]:
    """The server's request and token counters, read with prometheus_client itself (fleetgen's
    `Scrape.parse` reads only the samples fleetgen uses, and the request counter is not one)."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    totals = dict.fromkeys(("sglang:num_requests_total", "sglang:generation_tokens_total"), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:  # summed over label sets, as fleetgen sums
                totals[sample.name] += float(sample.value)
    return totals


async def test_a_warm_up_burst_at_the_top_level_precedes_the_measured_levels(sim_server: SimFactory) -> None:
    # A fresh server compiles kernels on its first batched prefill (100 s on SGLang MTP, H200): one unmeasured
    # burst at the top level (capped by the server) must come first, and count in no level.
    load = BenchLoad(
        input_len=16, output_len=8, concurrencies=(1, 3, 16), rounds=1, min_requests=2, warmup_tokens=5
    )
    async with sim_server(max_running_requests=6, enable_metrics=True) as (url, _):
        before = await _counters(url)
        levels = await sweep([BenchTarget("i0", (url,))], load)
        after = await _counters(url)
    assert [(r.concurrency, r.num_requests) for r in levels] == [(1, 2), (3, 3), (6, 6)]
    probe, warm_up = 1, 6
    sent = probe + warm_up + sum(r.num_requests for r in levels)
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == sent
    tokens = PROBE_TOKENS + warm_up * 5 + sum(r.output_tokens for r in levels)
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == tokens
    no_warm_up = dataclasses.replace(load, warmup_tokens=0)
    async with sim_server(max_running_requests=6, enable_metrics=True) as (url, _):
        await sweep([BenchTarget("i0", (url,))], no_warm_up)
        counted = await _counters(url)
    assert counted["sglang:num_requests_total"] == probe + sum(r.num_requests for r in levels)


async def test_levels_are_capped_by_the_servers_max_running_requests(sim_server: SimFactory) -> None:
    load = BenchLoad(input_len=16, output_len=4, concurrencies=(1, 4, 16), rounds=1, min_requests=2)
    async with sim_server(max_running_requests=4) as (url, _):
        levels = await sweep([BenchTarget("i0", (url,)), BenchTarget("fleet", (url, url))], load)
    assert [(r.target, r.concurrency, r.num_instances) for r in levels] == [
        ("i0", 1, 1),
        ("i0", 4, 1),
        ("fleet", 1, 2),
        ("fleet", 4, 2),
    ]
    assert levels[-1].num_requests == 2 * 4


async def test_accept_length_comes_from_the_engines_metrics(sim_server: SimFactory) -> None:
    # SGLang (and the sim) refresh the accept-length gauge at each decode log line, about once a second:
    # the level must outlast one (600 tokens at 160 steps/s × 2.5 accepted per step = 400 tok/s ≈ 1.5 s).
    load = BenchLoad(input_len=16, output_len=600, concurrencies=(2,), rounds=1, min_requests=2)
    flags = dict(
        speculative_algorithm="EAGLE", sim_accept_length=2.5, sim_decode_tps=160, enable_metrics=True
    )
    async with sim_server(**flags) as (url, _):
        (level,) = await sweep([BenchTarget("i0", (url,))], load)
    assert level.accept_length is not None
    assert level.accept_length == 2.5  # the sim's configured value, read from sglang:spec_accept_length


async def test_cli_json_and_png(sim_server: SimFactory, tmp_path: Path) -> None:
    need_chromium()
    png = tmp_path / "bench.png"
    async with sim_server(reasoning_parser="qwen3") as (url, _):
        argv = [
            str(FLEETGEN),
            "bench",
            "-e",
            url,
            "-e",
            url,
            "--input-len",
            "16",
            "--output-len",
            "8",
            "-c",
            "1,2",
            "--rounds",
            "1",
            "--json",
            "--png",
            str(png),
        ]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=PIPE, stderr=PIPE)
        stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    doc = json.loads(stdout)
    got = [(r["target"], r["concurrency"], r["num_failed"]) for r in doc["levels"]]
    address = url.split("://", 1)[1]  # bare URLs are named by their address; the same one again by its place
    assert got == [(t, c, 0) for t in (address, f"{address}#2", "fleet") for c in (1, 2)]
    assert all(r["output_tokens"] == r["num_requests"] * 8 for r in doc["levels"])
    width, _, colors = png_pixels(
        png
    )  # the chart's data: tests/unit/dashboard/test_svg.py; here: it is drawn
    assert width == svg.WIDTH * chromium.SCALE and {svg.color_for(k) for k in range(3)} <= colors


def test_cli_rejects_bad_levels() -> None:
    out = subprocess.run(
        [str(FLEETGEN), "bench", "-e", "http://127.0.0.1:9", "-c", "1,x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "--concurrency" in out.stderr and "fix:" in out.stderr


def test_cli_png_without_chromium_stops_before_the_sweep(tmp_path: Path) -> None:
    """No minutes of benchmark lost to a PNG that cannot be drawn: the rasteriser is checked first."""
    png = tmp_path / "bench.png"
    out = subprocess.run(
        [str(FLEETGEN), "bench", "-e", "http://127.0.0.1:9", "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": str(tmp_path)},  # no chromium on it
    )
    assert out.returncode == 1 and "Chromium" in out.stderr and "apt-get install" in out.stderr
    assert "127.0.0.1:9" not in out.stderr + out.stdout and not png.exists()


# Job files as users write them: sampling knobs of both engines in extra_body (some overriding the job's own
# fields, some naming bench's lengths, which bench keeps), unicode, a seed, thinking off.
UGLY_JOBS: list[dict[str, object]] = [
    {"temperature": 0.6, "top_p": 0.95},
    {
        "model": "sim-model",
        "temperature": 1.3,
        "top_p": 0.5,
        "top_k": 20,
        "seed": -7,
        "thinking": False,
        "max_tokens": 3,
        "system_prompt": "ünï «»",
        "extra_body": {
            "min_p": 0.05,
            "presence_penalty": 1.5,
            "repetition_penalty": 1.05,
            "stop": ["</s>", "\u2028"],
            "max_tokens": 2,
            "stream": False,
            "ignore_eos": False,
            "temperature": 0.7,
            "x-ünknown": {"nested": [1, "é", 2.5]},
        },
    },
]


def _received(log: str) -> list[dict[str, object]]:
    """The chat bodies the sim received, in order (it logs them with SGLang's --log-requests)."""
    marker = "Receive: obj="
    return [json.loads(line.split(marker, 1)[1]) for line in log.splitlines() if marker in line]


def _sampling_of(body: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in body.items() if key not in OWN_FIELDS}


async def test_every_request_of_a_sweep_with_a_job_carries_its_sampling(sim_server: SimFactory) -> None:
    # The probe, the unmeasured warm-up burst and every measured request: a server that compiles its sampling
    # kernel on the first request that needs it (vLLM's top-p) must meet that sampling before the levels.
    async with sim_server(log_requests=True, reasoning_parser="qwen3") as server:
        for values in UGLY_JOBS:
            job = JobFile.model_validate(values)
            load = BenchLoad(
                input_len=16,
                output_len=4,
                concurrencies=(1, 3),
                rounds=1,
                min_requests=1,
                warmup_tokens=5,
                sampling=SamplingParams.of(job).sampling,  # as `bench --job` takes it
            )
            seen = len(_received(server.log_text()))
            levels = await sweep([BenchTarget("i0", (server.base_url,))], load)
            bodies = _received(server.log_text())[seen:]
            assert len(bodies) == 1 + 3 + sum(r.num_requests for r in levels)  # probe, warm-up, levels
            lengths = sorted(cast(int, b["max_tokens"]) for b in bodies)
            assert lengths == sorted([PROBE_TOKENS] + [4] * 4 + [5] * 3)
            run_body = ChatRequests("m", 1, load.sampling).body([])  # the job's first request in `run`
            assert all(_sampling_of(b) == _sampling_of(run_body) for b in bodies)
            for key, value in job.extra_body.items():
                assert all(b[key] == value for b in bodies if key not in OWN_FIELDS)
            assert all(b["ignore_eos"] is True and b["stream"] is True for b in bodies)
            assert all(
                r.output_tokens == r.num_requests * 4 for r in levels
            )  # bench's lengths, not the job's


async def _fleetgen(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(str(FLEETGEN), *argv, stdout=PIPE, stderr=PIPE)
    stdout, stderr = await proc.communicate()
    return proc.returncode or 0, stdout.decode(), stderr.decode()


async def test_cli_bench_with_a_job_samples_as_run_with_that_job(
    sim_server: SimFactory, tmp_path: Path
) -> None:
    job = tmp_path / "job.toml"
    job.write_text(tomli_w.dumps(UGLY_JOBS[1]), encoding="utf-8")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n', encoding="utf-8")
    lengths = ["--input-len", "16", "--output-len", "6", "-c", "2", "--rounds", "1", "--scope", "instances"]
    async with sim_server(log_requests=True, reasoning_parser="qwen3") as server:
        rc, _, err = await _fleetgen(
            "run", str(prompts), "-o", str(tmp_path / "out"), "--endpoint", server.base_url, "--job", str(job)
        )
        assert rc == 0, err
        (run_body,) = _received(server.log_text())
        rc, out, err = await _fleetgen("bench", "-e", server.base_url, "--job", str(job), "--json", *lengths)
        assert rc == 0, err
        bench_bodies = _received(server.log_text())[1:]
        rc, out_greedy, err = await _fleetgen("bench", "-e", server.base_url, "--json", *lengths)
        assert rc == 0, err
        greedy_bodies = _received(server.log_text())[1 + len(bench_bodies) :]
    assert bench_bodies and all(_sampling_of(b) == _sampling_of(run_body) for b in bench_bodies)
    assert all(b["max_tokens"] in (PROBE_TOKENS, 6, 16) for b in bench_bodies)  # probe, levels, warm-up
    assert json.loads(out)["load"]["sampling"] == _sampling_of(run_body)  # the JSON records what was sent
    # Without --job: greedy, as before, and recorded so.
    assert greedy_bodies and all(_sampling_of(b) == {"temperature": 0.0} for b in greedy_bodies)
    assert json.loads(out_greedy)["load"]["sampling"] == {"temperature": 0.0}


def _scenario(out: Path) -> Any:
    """scripts/gpu_scenario.py's Scenario on an H200 run's fleet file, two prompts already written."""
    found = importlib.util.spec_from_file_location("gpu_scenario", ROOT / "scripts" / "gpu_scenario.py")
    assert found is not None and found.loader is not None
    scn = importlib.util.module_from_spec(found)
    found.loader.exec_module(scn)
    fleet = ROOT / "bench" / "results" / "raw" / "gpu-sglang-0.5.15-h200" / "fleet-sglang.toml"
    knobs = dict(input_len=16, output_len=6, levels="2", rounds=1, temperature=0.6, top_p=0.95, concurrency=2)
    (out / "prompts.jsonl").write_text('{"id": "p0", "prompt": "a b c"}\n{"id": "p1", "prompt": "d"}\n')
    return scn.Scenario(argparse.Namespace(out=out, fleet=fleet, prompts=2, **knobs))


async def test_the_gpu_scenarios_sweep_samples_as_its_run(sim_server: SimFactory, tmp_path: Path) -> None:
    """scripts/gpu_scenario.py's own `sweep` and `run` steps against the sim: the sweep before the measured
    run meets (and warms) the sampling that run sends."""
    scenario = _scenario(tmp_path)
    fleet = scenario.fleet_path
    async with sim_server(log_requests=True, reasoning_parser="qwen3") as server:
        scenario.state["spec"] = {"status_json": [{"url": server.base_url}]}
        await asyncio.to_thread(scenario.step_sweep, "spec", fleet)
        swept = _received(server.log_text())
        await asyncio.to_thread(scenario.step_run, "spec", fleet)
        ran = _received(server.log_text())[len(swept) :]
    assert scenario.state["spec"]["sweep"]["rc"] == scenario.state["spec"]["run"]["rc"] == 0
    assert swept and len(ran) == 2
    sampling = _sampling_of(ran[0])
    assert sampling["top_p"] == 0.95 and all(_sampling_of(b) == sampling for b in ran)
    assert all(_sampling_of(b) == sampling for b in swept)
