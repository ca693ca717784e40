"""The simulated SGLang server as a real process on a real loopback port.

SGLang itself cannot run here (no GPU), which is why this simulator exists; these tests drive the simulator's
real process through its real HTTP port and log, as fleetgen's driver will.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures import until
from tests.fixtures.ports import free_port
from tests.fixtures.sim import SimFactory

CHAT = "/v1/chat/completions"


async def post_chat(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + CHAT, json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def get_json(url: str, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


async def run_sim_once(*argv: str) -> tuple[int, str]:
    """Run the simulator to completion (for start failures): exit code and combined output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fleetgen.sim",
        "--model-path",
        "/m",
        "--port",
        str(free_port()),
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_ready_line_then_health(sim_server: SimFactory) -> None:
    async with sim_server(sim_start_delay=1.0) as srv:
        log = srv.log_text()
        assert log.splitlines()[0].endswith(
            "SIMULATION: this is fleetgen.sim, a simulated SGLang 0.5.23 "
            "server for tests and rehearsals. No model is loaded and no GPU "
            "is used; answers are synthetic."
        )
        # real SGLang 0.5.15 on an H200 logs the Mamba pool before the KV pool (tests/data/real-engines)
        order = [
            "Load weight begin",
            "Load weight end",
            "Mamba Cache is allocated. max_mamba_cache_size: ",
            "KV Cache is allocated. dtype: torch.bfloat16",
            "max_total_num_tokens=",
            "The server is fired up and ready to roll!",
        ]
        positions = [log.index(marker) for marker in order]
        assert positions == sorted(positions)
        async with aiohttp.ClientSession() as session, session.get(srv.base_url + "/health_generate") as resp:
            assert resp.status == 200


async def test_health_is_503_during_warmup(sim_server: SimFactory) -> None:
    port = free_port()
    task = asyncio.create_task(_probe_until_ok(port))
    async with sim_server(sim_start_delay=3.0, port=port):
        statuses = await asyncio.wait_for(task, 30)
    assert statuses[0] == 503 and statuses[-1] == 200


async def _probe_until_ok(port: int) -> list[int]:
    statuses: list[int] = []
    async with aiohttp.ClientSession() as session:
        while not statuses or statuses[-1] != 200:
            try:
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    statuses.append(resp.status)
            except aiohttp.ClientConnectionError:
                pass  # the port opens only after the pools are built, as in SGLang
            await asyncio.sleep(0.05)
    return statuses


async def test_oom_start_failure() -> None:
    code, out = await run_sim_once("--mem-fraction-static", "0.8", "--sim-fail-at-start", "oom")
    assert code == -9  # SGLang's launcher SIGKILLs its own process tree after the scheduler dies
    assert "Scheduler hit an exception: Traceback (most recent call last):" in out
    assert (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.8"
    ) in out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert "ready to roll" not in out


async def test_weights_too_big_fail_like_sglang() -> None:
    code, out = await run_sim_once("--sim-gpu-memory-gib", "40")
    assert code == -9
    assert (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=" in out
    )


async def test_valueerror_start_failure() -> None:
    code, out = await run_sim_once("--sim-fail-at-start", "valueerror")
    assert code == 1
    lines = out.rstrip().splitlines()
    assert "Traceback (most recent call last):" in lines
    assert lines[-1].startswith(
        "ValueError: Warning: User-specified context_length (524288) is greater than the derived "
        "context_length (262144)."
    )
    assert lines[-1].endswith("set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")


async def test_rule_failure_exact_text() -> None:
    code, out = await run_sim_once("--mamba-radix-cache-strategy", "no_buffer")
    assert code == 1
    assert out.rstrip().splitlines()[-1] == (
        "AssertionError: no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
    )


async def test_renamed_flag_is_an_argparse_error() -> None:
    code, out = await run_sim_once("--mamba-scheduler-strategy", "extra_buffer")
    assert code == 2
    assert out.rstrip().endswith(
        "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"
    )


async def test_server_info_reflects_flags(sim_server: SimFactory) -> None:
    flags = dict(
        speculative_algorithm="NEXTN",
        speculative_num_steps=2,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=3,
        mem_fraction_static=0.85,
        max_running_requests=8,
        disable_overlap_schedule=True,
        mamba_radix_cache_strategy="extra_buffer",
        sim_gpu_memory_gib=141,
    )
    async with sim_server(**flags) as (url, _):
        info = await get_json(url, "/server_info")
        alias = await get_json(url, "/get_server_info")
    assert info["speculative_algorithm"] == "EAGLE"
    steps = (
        info["speculative_num_steps"],
        info["speculative_eagle_topk"],
        info["speculative_num_draft_tokens"],
    )
    assert steps == (2, 1, 3)
    assert info["mamba_radix_cache_strategy"] == "extra_buffer" and info["disable_overlap_schedule"] is True
    assert info["mem_fraction_static"] == 0.85 and info["max_running_requests"] == 8
    assert info["version"] == "0.5.23" and info["max_total_num_tokens"] > 0
    state = info["internal_states"][0]
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert state["effective_max_running_requests_per_dp"] <= 8
    assert "--speculative-algorithm NEXTN" in info["launch_command"]
    assert alias["max_total_num_tokens"] == info["max_total_num_tokens"]


async def test_spec_reported_after_a_run(sim_server: SimFactory) -> None:
    async with sim_server(speculative_algorithm="EAGLE", sim_decode_tps=150, sim_output_tokens=500) as srv:
        before = await get_json(srv.base_url, "/server_info")
        assert "avg_spec_accept_length" not in before["internal_states"][0]
        status, _ = await post_chat(srv.base_url, user("hi"))
        assert status == 200
        after = await get_json(srv.base_url, "/server_info")
        await until(lambda: "Decode batch, #running-req: " in srv.log_text(), timeout_s=10)
        log = srv.log_text()
    assert 1.0 < after["internal_states"][0]["avg_spec_accept_length"] <= 4.0
    decode = [line for line in log.splitlines() if "Decode batch, #running-req: " in line]
    assert decode and "accept len: " in decode[0] and "gen throughput (token/s): " in decode[0]


async def test_no_spec_knob_hides_speculative_decoding(sim_server: SimFactory) -> None:
    async with sim_server(speculative_algorithm="EAGLE", sim_no_spec=True, sim_output_tokens=50) as (url, _):
        await post_chat(url, user("hi"))
        info = await get_json(url, "/server_info")
    assert "--speculative-algorithm EAGLE" in info["launch_command"]
    assert info["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in info["internal_states"][0]


async def test_metrics_parse_with_prometheus_parser(sim_server: SimFactory) -> None:
    async with sim_server(enable_metrics=True, speculative_algorithm="EAGLE", sim_output_tokens=40) as (
        url,
        _,
    ):
        await post_chat(url, user("hi"))
        async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
            text = await resp.text()
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    for name in (
        "sglang:gen_throughput",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:spec_accept_length",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
    ):
        assert name in samples, name
    generated = sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "sglang:generation_tokens_total"
    )
    assert generated == 40
    assert samples["sglang:num_running_reqs"].labels["model_name"] == "/models/sim-model"


async def test_metrics_absent_without_flag(sim_server: SimFactory) -> None:
    async with (
        sim_server() as (url, _),
        aiohttp.ClientSession() as session,
        session.get(url + "/metrics") as resp,
    ):
        assert resp.status == 404
