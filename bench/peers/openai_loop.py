"""Peer (a): the usual hand-written generation script — `openai.AsyncOpenAI` + a semaphore, appending JSONL.

Runs in the bench venv (bench/setup.sh), never in fleetgen's. It is written the way people write it (one task
per record, `asyncio.gather`, one `json.dumps` + `write` per completion), with nothing slowed down on
purpose and nothing optimised beyond what such a script usually has.

    python openai_loop.py INPUT.jsonl OUT.jsonl --base-url http://127.0.0.1:P/v1 --model M --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TextIO

from openai import AsyncOpenAI


async def generate(args: argparse.Namespace, records: list[dict[str, str]], out: TextIO) -> None:
    client = AsyncOpenAI(base_url=args.base_url, api_key="none", max_retries=5, timeout=3600)
    semaphore = asyncio.Semaphore(args.concurrency)

    async def one(record: dict[str, str]) -> None:
        async with semaphore:
            resp = await client.chat.completions.create(
                model=args.model,
                messages=[{"role": "user", "content": record["prompt"]}],
                max_tokens=args.max_tokens,
                temperature=args.temperature,
            )
        message = resp.choices[0].message
        extra = message.model_extra or {}
        row = {
            "id": record["id"],
            "content": message.content,
            "reasoning": extra.get("reasoning_content") or extra.get("reasoning"),
            "finish_reason": resp.choices[0].finish_reason,
            "usage": resp.usage.model_dump() if resp.usage else None,
        }
        out.write(json.dumps(row) + "\n")

    await asyncio.gather(*(one(r) for r in records))
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--temperature", type=float, default=0.6)
    args = parser.parse_args()
    with open(args.input, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with open(args.output, "a", encoding="utf-8") as out:
        asyncio.run(generate(args, records, out))
