"""`fleet.enginestate.read_engine`: the one reader of an engine's own numbers, for a fleet's instance and a
bare `--endpoint` URL alike. The server is the test stand-in (an aiohttp app serving /metrics as vLLM
writes it; a real vLLM does not run in unit tests)."""

from __future__ import annotations

from fleetgen.engines import get_engine
from fleetgen.fleet.enginestate import read_engine
from fleetgen.http.client import EngineClient
from tests.fixtures.standin import StandIn, serve

VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 5
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{kv_cache_size_tokens="452340",kv_cache_max_concurrency="110.4"} 1
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} %d
"""


async def test_a_bare_url_reads_as_a_fleets_instance() -> None:
    """Recognised from its metric names, it gives the numbers the fleet's engine gives: load, max running
    (vLLM: its capacity at max-model-len, a floor, or the argv's max-num-seqs), throughput over two reads."""
    async with serve(StandIn(metrics_text=VLLM % 100)) as server, EngineClient(server.url) as client:
        bare = await read_engine(client, None, None)
        known = await read_engine(client, get_engine("vllm"), None, args=("--max-num-seqs", "64"))
        server.metrics_text = VLLM % 400
        later = await read_engine(client, None, bare.scrape)
        no_info = await read_engine(client, get_engine("sglang"), None)  # SGLang's /server_info: not there
    assert (bare.load.running, bare.load.queued) == (known.load.running, known.load.queued) == (5, 2)
    assert (bare.max_running_requests, known.max_running_requests) == (110, 64)
    # without max-num-seqs vLLM's figure is a floor it runs past (`run` fills it); with it, its cap
    assert bare.running_is_floor and not known.running_is_floor and not no_info.running_is_floor
    assert bare.problem == "" and later.load.gen_tokens_per_s is not None and later.load.gen_tokens_per_s > 0
    # An info JSON that does not answer is reported, for the caller to judge (a fleet's instance: waiting).
    assert "info endpoint did not answer" in no_info.problem and no_info.max_running_requests is None
