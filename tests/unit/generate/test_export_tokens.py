"""`generate.export_tokens`: the loss mask is SpecForge's rule (`GeneralParser.parse`: each assistant span's
tokens counted by encoding the text before the span's start and end) for any conversation the template
renders; a row is the stored ids exactly, closed as the template closes a finished turn; a text-only row is
tokenized and decodes back, and one that does not is dropped, never kept. The real SpecForge reads the rows
in tests/integration/generate/test_export_tokens.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers

from fleetgen.chattemplate import ModelTokens, TurnMarkers
from fleetgen.generate.export_tokens import NO_ROUND_TRIP, TokenBuilder, loss_mask
from fleetgen.generate.ledger import tokenids
from fleetgen.generate.ledger.schema import ResultRow
from fleetgen.generate.ledger.tokenids import TokenIds
from tests.fixtures.chatml import chatml_folder, special_id

TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="<>"), min_size=1, max_size=24)
TURNS = st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=4)  # (user, assistant) pairs


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chatml_folder(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def builder(folder: Path) -> TokenBuilder:
    return TokenBuilder(folder, thinking=True)


def specforge_mask(tokens: ModelTokens, text: str, markers: TurnMarkers) -> list[int]:
    """SpecForge 0.2.0's `GeneralParser.parse` mask, restated: its regex over the text, each span's token
    indices by encoding the text before the span's start and before its end."""
    pattern = re.escape(markers.assistant_header) + r"([\s\S]*?(?:" + re.escape(markers.end_of_turn) + "|$))"
    ids = tokens.encode(text)
    mask = [0] * len(ids)
    for match in re.finditer(pattern, text, re.DOTALL):
        start = len(tokens.encode(text[: match.start(1)]))
        end = len(tokens.encode(text[: match.end(1)]))
        for i in range(min(start, len(ids)), min(end, len(ids))):
            mask[i] = 1
    return mask


@settings(max_examples=150, deadline=None)
@given(turns=TURNS, open_last=st.booleans())
def test_the_mask_is_specforges_for_any_rendered_conversation(
    builder: TokenBuilder, turns: list[tuple[str, str]], open_last: bool
) -> None:
    messages: list[dict[str, Any]] = []
    for user, answer in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    text = builder.template.render(messages, add_generation_prompt=False, thinking=True)
    if open_last:  # a truncated last turn: no end of turn
        text = text.removesuffix(builder.markers.end_of_turn)
    ids = builder.tokens.encode(text)
    ours = loss_mask(builder.tokens.token_bytes(ids), builder.markers)
    assert ours == specforge_mask(builder.tokens, text, builder.markers)
    assert sum(ours) >= len(turns)  # every answer's end of turn at least


def result(prompt: str, content: str, reasoning: str, finish: str, token_ids: Any = None) -> ResultRow:
    """A stored row of one turn answering `prompt` (`token_ids`: what the engine returned, if anything)."""
    return ResultRow(
        id="r",
        sample=0,
        khash=1,
        source="f",
        line=1,
        prompt=orjson.dumps([[{"role": "user", "content": prompt}]]).decode(),
        content=content,
        reasoning_content=reasoning,
        turns=None,
        num_turns=1,
        finish_reason=finish,
        prompt_tokens=None,
        completion_tokens=None,
        instance="s0",
        model="m",
        params_hash="h",
        attempts=1,
        started_at=0.0,
        latency_s=0.1,
        finished_at=0.0,
        is_truncated=int(finish == "length"),
        is_empty=0,
        has_leaked_think=0,
        is_repetitive=0,
        chash=0,
        input_index=0,
        token_ids=None
        if token_ids is None
        else tokenids.pack(TokenIds(token_ids["prompt"], token_ids["output"])),
    )


def test_stored_ids_are_kept_exactly_and_a_finished_turn_is_closed(builder: TokenBuilder) -> None:
    """The engine's ids, not the text's tokens (here deliberately not the canonical ones: one byte a token),
    then only the newline the template puts after the end-of-sequence token the engine generated."""
    prompt = builder.tokens.encode(
        builder.template.render([{"role": "user", "content": "q"}], add_generation_prompt=True, thinking=True)
    )
    output = [*builder.tokens.encode("t"), *builder.tokens.encode("h"), special_id("<|im_end|>")]
    row = builder.row(result("q", "th", "", "stop", {"prompt": prompt, "output": output}))
    assert not isinstance(row, str) and row.is_exact
    assert row.input_ids == [*prompt, *output, *builder.tokens.encode("\n")]
    assert row.loss_mask == [0] * (len(prompt) - 2) + [1] * (len(output) + 3)  # "<think>\n" from the prompt
    cut = builder.row(result("q", "th", "", "length", {"prompt": prompt, "output": output[:2]}))
    assert not isinstance(cut, str) and cut.input_ids == [*prompt, *output[:2]]  # left open


def test_a_text_only_row_is_tokenized_as_served_and_decodes_back(builder: TokenBuilder) -> None:
    row = builder.row(result("héllo 🙂", "answer", "think about it", "stop"))
    assert not isinstance(row, str) and not row.is_exact
    text = builder.tokens.decode(row.input_ids)
    assert text == (
        "<|im_start|>user\nhéllo 🙂<|im_end|>\n<|im_start|>assistant\n<think>\nthink about it\n</think>\n\n"
        "answer<|im_end|>\n"
    )


def test_a_row_whose_tokens_do_not_decode_back_is_dropped(tmp_path: Path, folder: Path) -> None:
    """A tokenizer that normalizes (NFKC: the ligature ﬁ becomes f, i) cannot give the stored text back."""
    spec = Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec.normalizer = normalizers.NFKC()
    other = chatml_folder(tmp_path / "nfkc")
    spec.save(str(other / "tokenizer.json"))
    nfkc = TokenBuilder(other, thinking=True)
    assert not isinstance(nfkc.row(result("q", "fine", "", "stop")), str)
    assert nfkc.row(result("q", "ﬁne", "", "stop")) == NO_ROUND_TRIP
