"""Every record a job accepts exports in a form SpecForge's OWN training code reads (marker `specforge`).

A real job (the real store, through `Job`, against the simulated SGLang server `fleetgen.sim` with its
qwen3 reasoning parser: SGLang's bodies, `reasoning_content` apart) runs inputs of every accepted shape: a
plain prompt, a chat with a system message, multi-turn with the old model's assistant history, two
consecutive user turns, a leading assistant turn, ShareGPT speaker names, list-of-parts content, truncated
rows (answer begun, or all tokens spent reasoning); a server started without a reasoning parser leaks the
think marker into the answer; hypothesis adds random conversations. The SpecForge export is then read by
SpecForge 0.2.0's `specforge.data` preprocessing (what training maps over the file) with the tiny model's
real tokenizer, in SpecForge's own venv (tests/fixtures/specforge_oracle.py). Skipped locally when it is not
installed; a failure under CI=true. The real vLLM-CPU job's export is read the same way in test_run_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fleetgen.generate.export import EMPTY, THINK, export
from tests.fixtures.jobs import new_job, params, write_jsonl
from tests.fixtures.sim import SimFactory
from tests.fixtures.specforge_oracle import (
    assert_specforge_keeps_every_turn,
    read_with_specforge,
    specforge_tools,
)

pytestmark = pytest.mark.specforge
OLD = "OLDMODEL"  # in every input assistant turn: it must never reach an exported assistant turn
# SGLang with the qwen3 parser, 40 tokens an answer (30 reasoning); the job's max_tokens is 64.
SIM_FLAGS: dict[str, object] = dict(reasoning_parser="qwen3", sim_output_tokens=40)


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
    {"id": "truncated", "prompt": "long one [[sim:finish=length]]"},  # the answer begun
    {"id": "truncated-in-reasoning", "prompt": "longer [[sim:tokens=400]]"},  # 64 tokens, all reasoning
]

ROLES = ["system", "user", "human", "assistant", "gpt"]
TEXT = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30).filter(str.strip)
TURN = st.tuples(st.sampled_from(ROLES), TEXT)
CONVERSATION = st.lists(TURN, min_size=1, max_size=8)


@pytest.fixture(scope="module")
def specforge() -> tuple[str, Path]:
    return specforge_tools()


def as_record(index: int, turns: list[tuple[str, str]]) -> dict[str, Any]:
    """A random conversation, ShareGPT-spelled for half of them; assistant text marked as the old model's."""
    text = [(role, f"{OLD} {t}" if role in ("assistant", "gpt") else t) for role, t in turns]
    if index % 2:
        return {"id": f"h{index}", "conversations": [{"from": r, "value": t} for r, t in text]}
    return {"id": f"h{index}", "messages": [{"role": r, "content": t} for r, t in text]}


async def export_and_read(
    tmp: Path, records: list[dict[str, Any]], specforge: tuple[str, Path], sim_server: SimFactory
) -> None:
    """Run the job on the sim, export SpecForge rows, read each with SpecForge's own code, check the
    invariants."""
    prompts = write_jsonl(tmp / "in.jsonl", records)
    async with sim_server(**SIM_FLAGS) as server:
        summary = await new_job(tmp, prompts, [server.base_url], params=params(thinking=True)).run()
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
    assert_specforge_keeps_every_turn(rows, verdicts)


async def test_every_named_input_shape_exports_rows_specforge_reads(
    tmp_path: Path, specforge: tuple[str, Path], sim_server: SimFactory
) -> None:
    await export_and_read(tmp_path, NAMED_SHAPES, specforge, sim_server)
    exported = export(tmp_path / "out", "sharegpt", tmp_path / "again.jsonl")
    assert exported.dropped == {EMPTY: 1} and exported.truncated_written == 1
    assert any("1 truncated rows written" in note for note in exported.notes)


async def test_a_leaked_think_marker_is_dropped_by_reason(tmp_path: Path, sim_server: SimFactory) -> None:
    """SGLang without a reasoning parser answers with the raw text, `</think>` and all, as the content: the
    SpecForge export drops that row (SpecForge's --strict-think-markers would refuse it) and says why."""
    prompts = write_jsonl(
        tmp_path / "in.jsonl", [{"id": "leaked", "prompt": "leaky"}, {"id": "b", "prompt": "q"}]
    )
    async with sim_server(sim_output_tokens=40) as server:
        summary = await new_job(tmp_path, prompts, [server.base_url], params=params(thinking=True)).run()
    assert summary.results == 2
    exported = export(tmp_path / "out", "sharegpt", tmp_path / "train.jsonl")
    assert exported.rows == 0 and exported.dropped == {THINK: 2}


@settings(
    max_examples=3,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrink: ~20 s a try
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(conversations=st.lists(CONVERSATION, min_size=30, max_size=30))
async def test_any_accepted_conversation_exports_in_a_form_specforge_reads(
    tmp_path_factory: pytest.TempPathFactory,
    specforge: tuple[str, Path],
    sim_server: SimFactory,
    conversations: list[Any],
) -> None:
    """Invariant: whatever conversations the job accepts (the rest are bad input), each exported row reads in
    SpecForge's own preprocessing with every assistant turn kept, and none is the input's old text."""
    records = [as_record(i, turns) for i, turns in enumerate(conversations)] + [
        {"id": "anchor", "prompt": "q"}
    ]
    await export_and_read(tmp_path_factory.mktemp("h"), records, specforge, sim_server)
