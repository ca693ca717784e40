"""Every record a job accepts exports in a form SpecForge's OWN training code reads (marker `specforge`).

A real job (the real store, through `Job`, against the stand-in server) runs inputs of every accepted shape:
a plain prompt, a chat with a system message, multi-turn with the old model's assistant history, two
consecutive user turns, a leading assistant turn, ShareGPT speaker names, list-of-parts content, truncated
rows (answer begun, or all tokens spent reasoning) and a leaked think marker; hypothesis adds random
conversations. The SpecForge export is then read by SpecForge 0.2.0's `specforge.data` preprocessing (what
training maps over the file) with the tiny model's real tokenizer, in SpecForge's own venv
(scripts/install-specforge.sh; FLEETGEN_SPECFORGE_PYTHON names its python). Skipped locally when it is not
installed; a failure under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fleetgen.generate.export import EMPTY, THINK, export
from tests.fixtures import skip_or_fail
from tests.fixtures.vllm import default_tiny_model_dir
from tests.unit.test_generate_job import new_job, params, write_jsonl
from tests.unit.test_generate_standin import StandIn, serve

pytestmark = pytest.mark.specforge
PYTHON = os.environ.get("FLEETGEN_SPECFORGE_PYTHON", "")
CHECK = Path(__file__).resolve().parent.parent / "fixtures" / "specforge_check.py"
TEMPLATE = "qwen3-thinking"  # SpecForge's template for the tiny model's Qwen3-style ChatML
OLD = "OLDMODEL"  # in every input assistant turn: it must never reach an exported assistant turn
ALLOWED_WARNING = "The first message is from system"


def turn(role: str, text: str, *, sharegpt: bool = False) -> dict[str, str]:
    return {"from": role, "value": text} if sharegpt else {"role": role, "content": text}


def gpt(text: str) -> dict[str, str]:
    return turn("gpt", f"{OLD} {text}", sharegpt=True)


def human(text: str) -> dict[str, str]:
    return turn("human", text, sharegpt=True)


NAMED_SHAPES: list[dict[str, Any]] = [
    {"id": "plain", "prompt": "What is 2+2?"},
    {"id": "system", "messages": [turn("system", "Be brief."), turn("user", "Hi")]},
    {
        "id": "history",
        "conversations": [
            turn("system", "sys", sharegpt=True),
            human("u1"),
            gpt("a1"),
            human("u2"),
            gpt("a2"),
        ],
    },
    {"id": "two-users", "conversations": [human("first"), human("second"), gpt("x"), human("third")]},
    {"id": "leading-assistant", "messages": [turn("assistant", f"{OLD} Hi! Ask me."), turn("user", "Help")]},
    {
        "id": "two-assistants",
        "messages": [
            turn("user", "q"),
            turn("assistant", f"{OLD} x"),
            turn("assistant", f"{OLD} y"),
            turn("user", "q2"),
        ],
    },
    {
        "id": "parts",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}]},
            turn("user", "and this"),
        ],
    },
    {"id": "truncated", "prompt": "long one [[sim:finish=length]]"},
    {"id": "truncated-in-reasoning", "prompt": "longer [[sim:finish=length:empty]]"},
    {"id": "leaked", "prompt": "leaky [[sim:leak]]"},
]

ROLES = ["system", "user", "human", "assistant", "gpt"]
TEXT = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30).filter(str.strip)
TURN = st.tuples(st.sampled_from(ROLES), TEXT)
CONVERSATION = st.lists(TURN, min_size=1, max_size=8)


def _skip_or_fail(reason: str) -> None:
    skip_or_fail("SpecForge's own code", reason)


@pytest.fixture(scope="module")
def specforge() -> tuple[str, Path]:
    if not PYTHON or not Path(PYTHON).exists():
        _skip_or_fail("set FLEETGEN_SPECFORGE_PYTHON to scripts/install-specforge.sh's venv python")
    tokenizer = default_tiny_model_dir()
    if not (tokenizer / "tokenizer.json").is_file():
        _skip_or_fail(f"no tiny model at {tokenizer}: run scripts/build_tiny_model.py (FLEETGEN_TINY_MODEL)")
    return PYTHON, tokenizer


def as_record(index: int, turns: list[tuple[str, str]]) -> dict[str, Any]:
    """A random conversation, ShareGPT-spelled for half of them; assistant text marked as the old model's."""
    text = [(role, f"{OLD} {t}" if role in ("assistant", "gpt") else t) for role, t in turns]
    if index % 2:
        return {"id": f"h{index}", "conversations": [{"from": r, "value": t} for r, t in text]}
    return {"id": f"h{index}", "messages": [{"role": r, "content": t} for r, t in text]}


async def export_and_read(tmp: Path, records: list[dict[str, Any]], specforge: tuple[str, Path]) -> None:
    """Run the job, export SpecForge rows, read each with SpecForge's own code, check the invariants."""
    prompts = write_jsonl(tmp / "in.jsonl", records)
    async with serve(StandIn()) as server:
        summary = await new_job(tmp, prompts, [server.url], params=params(thinking=True)).run()
    assert summary.results > 0, summary
    path = tmp / "train.jsonl"
    exported = export(tmp / "out", "sharegpt", path)
    assert exported.rows + exported.skipped == summary.results  # every result written, or dropped by reason
    assert set(exported.dropped) <= {EMPTY, THINK}
    rows = [json.loads(line) for line in path.read_bytes().splitlines()]  # bytes: U+0085 is not a line end
    for row in rows:
        roles = [m["role"] for m in row["conversations"]]
        start = 1 if roles[0] == "system" else 0
        assert roles[start::2] == ["user"] * len(roles[start::2]), row  # then user / assistant alternating
        assert (
            roles[start + 1 :: 2] == ["assistant"] * len(roles[start + 1 :: 2]) and roles[-1] == "assistant"
        )
        for message in row["conversations"]:
            if message["role"] == "assistant":
                assert OLD not in message["content"] and message["reasoning_content"].strip(), row
    verdicts = await asyncio.to_thread(read_with_specforge, path, specforge)
    assert [v["id"] for v in verdicts] == [row["id"] for row in rows]
    for verdict, row in zip(verdicts, rows, strict=True):
        num_assistant = sum(m["role"] == "assistant" for m in row["conversations"])
        assert [w for w in verdict["warnings"] if not w.startswith(ALLOWED_WARNING)] == [], (row, verdict)
        assert verdict["assistant_turns_rendered"] == num_assistant and verdict["loss_tokens"] > 0, (
            row,
            verdict,
        )


def read_with_specforge(path: Path, specforge: tuple[str, Path]) -> list[dict[str, Any]]:
    python, tokenizer = specforge
    done = subprocess.run(
        [python, str(CHECK), str(path), str(tokenizer), TEMPLATE],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_every_named_input_shape_exports_rows_specforge_reads(
    tmp_path: Path, specforge: tuple[str, Path]
) -> None:
    await export_and_read(tmp_path, NAMED_SHAPES, specforge)
    exported = export(tmp_path / "out", "sharegpt", tmp_path / "again.jsonl")
    assert exported.dropped == {EMPTY: 1, THINK: 1} and exported.truncated_written == 1
    assert any("1 truncated rows written" in note for note in exported.notes)


@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrink: ~20 s a try
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(conversations=st.lists(CONVERSATION, min_size=30, max_size=30))
async def test_any_accepted_conversation_exports_in_a_form_specforge_reads(
    tmp_path_factory: pytest.TempPathFactory, specforge: tuple[str, Path], conversations: list[Any]
) -> None:
    """Invariant: whatever conversations the job accepts (the rest are bad input), each exported row reads in
    SpecForge's own preprocessing with every assistant turn kept, and none is the input's old text."""
    records = [as_record(i, turns) for i, turns in enumerate(conversations)] + [
        {"id": "anchor", "prompt": "q"}
    ]
    await export_and_read(tmp_path_factory.mktemp("h"), records, specforge)
