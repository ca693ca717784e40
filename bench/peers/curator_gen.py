"""Peer (b): Bespoke Curator (`bespokelabs-curator`) on an OpenAI-compatible server, rate limits set high.

Runs in the bench venv (bench/setup.sh). Curator persists responses in its own working directory (JSONL, then
an Arrow dataset); that is its durable store, as fleetgen's is its own. Telemetry and the hub cost map are
turned off: nothing may leave loopback.

    python curator_gen.py INPUT.jsonl WORKDIR --base-url http://127.0.0.1:P/v1 --model M --concurrency 256
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

# Before importing curator/litellm: no telemetry, no network look-ups of model prices, no live TUI.
os.environ.setdefault("TELEMETRY_ENABLED", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("CURATOR_DISABLE_RICH_DISPLAY", "1")
os.environ.setdefault("BESPOKE_CURATOR_TRACKER_DISABLED", "1")
os.environ.setdefault("OPENAI_API_KEY", "none")

import tiktoken
from bespokelabs import curator
from bespokelabs.curator.request_processor.online import openai_online_request_processor as oorp
from datasets import Dataset


def offline_encoding() -> tiktoken.Encoding:
    """A real tiktoken encoder that needs no download: byte-level ranks, no merges.

    Curator asks tiktoken for cl100k_base only to estimate *input* tokens for its rate limiter; cl100k_base is
    downloaded at run time, which cannot happen here. Byte-level encoding of the short prompts costs about the
    same CPU (it can only flatter Curator, never penalise it).
    """
    return tiktoken.Encoding(
        name="bytes-offline",
        pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={},
    )


oorp.OpenAIOnlineRequestProcessor.get_token_encoding = lambda self: offline_encoding()


class Generate(curator.LLM):  # type: ignore[misc]  # curator is untyped, and absent from fleetgen's venv
    """One chat completion per record; keep content and reasoning, as fleetgen and the openai loop do."""

    return_completions_object = True

    def prompt(self, row: dict[str, str]) -> list[dict[str, str]]:
        return [{"role": "user", "content": row["prompt"]}]

    def parse(self, row: dict[str, str], response: dict[str, Any]) -> dict[str, object]:
        choice = response["choices"][0]
        message = choice["message"]
        return {
            "id": row["id"],
            "content": message.get("content"),
            "reasoning": message.get("reasoning_content") or message.get("reasoning"),
            "finish_reason": choice.get("finish_reason"),
        }


def main(args: argparse.Namespace) -> None:
    with open(args.input, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    dataset = Dataset.from_list(records)
    llm = Generate(
        model_name=args.model,
        backend="openai",
        generation_params={"max_tokens": args.max_tokens, "temperature": args.temperature},
        backend_params={
            "base_url": args.base_url,
            "api_key": "none",
            "max_requests_per_minute": 10_000_000,  # "rate limits set high": the server is the only limit
            "max_tokens_per_minute": 10_000_000_000,
            "max_concurrent_requests": args.concurrency,
            "require_all_responses": False,
            "invalid_finish_reasons": ["content_filter"],  # ignore_eos/max_tokens ends are valid here
            "return_completions_object": True,
        },
    )
    result = llm(dataset, working_dir=args.workdir)
    print(json.dumps({"rows": len(result.dataset) if hasattr(result, "dataset") else len(result)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("workdir")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--temperature", type=float, default=0.6)
    main(parser.parse_args())
