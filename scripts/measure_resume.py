"""Measure how long a resumed `fleetgen run` takes to send its first request, with a large store.

    .venv/bin/python scripts/measure_resume.py [--rows 1000000] [--todo 1000] [--prompt-bytes 170] [--dir DIR]

Builds (once, cached in --dir) an input of ROWS + TODO JSONL records and a store holding the first ROWS of
them as results, then times resumes to the first chat request a local stand-in server receives:
  - `valid`: the input is unchanged since the position was saved (size + mtime): seek past the done prefix;
  - `touched`: the input's mtime changed (as when records are appended): the done prefix is hashed once and
    compared with the saved digests, then the same seek;
  - `no-id`: like `touched`, with records that have no id field (ids are content hashes);
  - `rescan`: the saved position no longer holds (the prefix hashes differently): every record is re-read
    and checked against the store (id and content), as after `--add-input`.
A measurement, not a test: it prints the numbers and asserts nothing about them.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from fleetgen.config import JobFile
from fleetgen.generate.ledger.identity import ResumeCheck, identify
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.runner import Job, JobServers
from fleetgen.generate.source import content_hash, content_id
from fleetgen.generate.work import JobOptions, RecordShape, SamplingParams, key_hash

PARAMS = SamplingParams.of(JobFile(model="m", max_tokens=16, temperature=0.0, top_p=1.0))


def record(i: int, with_id: bool, prompt_bytes: int) -> dict[str, Any]:
    sentence = f"Explain topic number {i} in detail, with examples and a short summary at the end. "
    text = (sentence * (prompt_bytes // len(sentence) + 1))[:prompt_bytes]
    return {"id": f"rec-{i:08d}", "prompt": text} if with_id else {"prompt": text}


def build(folder: Path, rows: int, todo: int, with_id: bool, prompt_bytes: int) -> tuple[Path, Path]:
    """Input file and a store with its first `rows` records done (built once per configuration)."""
    tag = f"{rows}-{todo}-{prompt_bytes}-{'id' if with_id else 'noid'}"
    prompts, out = folder / f"prompts-{tag}.jsonl", folder / f"out-{tag}"
    if (out / "results.sqlite").exists():
        return prompts, out
    folder.mkdir(parents=True, exist_ok=True)
    with prompts.open("wb") as fh:
        for i in range(rows + todo):
            fh.write(orjson.dumps(record(i, with_id, prompt_bytes)) + b"\n")
    store = Store.open(out)
    store.set_meta(
        {
            "params": PARAMS.to_json(),
            "input": str(prompts),
            "input_identity": orjson.dumps(identify(prompts, None, RecordShape())).decode(),
        }
    )
    conn = store.conn
    conn.execute("BEGIN")
    chunk: list[tuple[Any, ...]] = []
    for i in range(rows):
        raw = record(i, with_id, prompt_bytes)
        rid = f"rec-{i:08d}" if with_id else content_id(raw)
        chash = content_hash([[{"role": "user", "content": raw["prompt"]}]])
        chunk.append(
            (rid, 0, key_hash(rid, 0), str(prompts), i + 1, "answer", "thinking", "stop", 5, 5, "s0", chash)
        )
        if len(chunk) == 50_000:
            _insert(conn, chunk)
            chunk = []
    _insert(conn, chunk)
    conn.execute("COMMIT")
    store.close()
    return prompts, out


def _insert(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.executemany(
        "INSERT INTO results (id, sample, khash, source, line, content, reasoning_content, finish_reason, "
        "prompt_tokens, completion_tokens, instance, chash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )


def set_position(out: Path, prompts: Path, line: int, *, case: str) -> None:
    offset = 0
    with prompts.open("rb") as fh:
        for _ in range(line):
            offset += len(fh.readline())
    store = Store.open(out)
    saved = ResumeCheck(prompts, identify(prompts, None, RecordShape()), None).value(line, offset)
    if case != "valid":
        saved["stat"] = [[0, 0]]  # the input's size or mtime changed since (touched, or records appended)
    if case == "rescan":
        saved["chain"][-1][1] = "0" * 32  # and the bytes before the position changed too
    store.set_meta({"position": orjson.dumps(saved).decode()})
    store.conn.execute("DELETE FROM results WHERE line > ?", (line,))  # redo the tail each time
    store.close()


async def first_request_s(prompts: Path, out: Path) -> float:
    """Seconds from `Job.run()` to the first chat request at the stand-in; the job is then stopped."""
    first = asyncio.get_running_loop().create_future()
    job: Job | None = None

    async def chat(request: web.Request) -> web.Response:
        if not first.done():
            first.set_result(time.monotonic())
            assert job is not None
            job.stop()
            job.stop()  # abandon the rest: only the first dispatch is measured
        await request.read()
        return web.json_response({"choices": [{"message": {"content": "a"}, "finish_reason": "stop"}]})

    async def models(_r: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        options = JobOptions(input_path=prompts, out_dir=out, params=PARAMS, concurrency=1)
        job = Job(options, JobServers([("s0", f"http://127.0.0.1:{port}")]))
        started = time.monotonic()
        await job.run()
        return float(await first) - started
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--todo", type=int, default=1000)
    parser.add_argument("--prompt-bytes", type=int, default=170)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/fleetgen-resume"))
    parser.add_argument("--cases", default="valid,touched,no-id,rescan")
    args = parser.parse_args()
    for case in args.cases.split(","):
        prompts, out = build(args.dir, args.rows, args.todo, case != "no-id", args.prompt_bytes)
        set_position(out, prompts, args.rows, case=case)
        seconds = asyncio.run(first_request_s(prompts, out))
        size = prompts.stat().st_size / 1e6
        print(
            f"{case:8s} rows={args.rows:,} input={size:,.0f} MB first dispatch after {seconds:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
