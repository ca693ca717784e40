"""The sim's `return_token_ids` (`sim.tokens`, `sim.chat`): SGLang 0.5.23's field names in the choice, the
prompt rendered with the model folder's template, the raw answer tokenized with its end of sequence where it
stopped; refused on a stream in SGLang's words; none from a sim with no tokenizer."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from fleetgen.chattemplate import ModelTokens
from fleetgen.sim.chat import chat_response, parse_chat_request
from fleetgen.sim.sampling import RequestError
from fleetgen.sim.text import Generation
from fleetgen.sim.tokens import SimTokens
from tests.fixtures.chatml import chatml_folder, special_id

GEN = Generation("some reasoning", "the answer", 5, 2, "stop", (), ())


def test_ids_are_the_template_rendered_prompt_and_the_raw_answer(tmp_path: Path) -> None:
    folder = chatml_folder(tmp_path / "m")
    sim = SimTokens.load(str(folder))
    assert sim is not None and SimTokens.load(str(tmp_path / "none")) is None and SimTokens.load(None) is None
    tokens = ModelTokens(folder / "tokenizer.json")
    prompt, output = sim.ids([{"role": "user", "content": "hi"}], True, GEN)
    assert tokens.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tokens.decode(output) == "some reasoning\n</think>\n\nthe answer<|im_end|>"
    assert output[-1] == special_id("<|im_end|>")
    cut = Generation("some", "", 2, 2, "length", (), ())
    _, open_ids = sim.ids([{"role": "user", "content": "hi"}], True, cut)
    assert tokens.decode(open_ids) == "some\n</think>\n\n"  # no end of sequence: it did not stop


def test_the_choice_carries_sglangs_field_names() -> None:
    body = orjson.loads(chat_response("id", 0, "m", [GEN], 3, 2, [([1, 2], [3, 4])]))
    choice = body["choices"][0]
    assert (choice["prompt_token_ids"], choice["response_token_ids"]) == ([1, 2], [3, 4])
    plain = orjson.loads(chat_response("id", 0, "m", [GEN], 3, 2))["choices"][0]
    assert "prompt_token_ids" not in plain and "response_token_ids" not in plain


def test_return_token_ids_on_a_stream_is_refused_as_sglang_refuses_it() -> None:
    body = {"messages": [{"role": "user", "content": "q"}], "return_token_ids": True}
    assert parse_chat_request(body, None, 1000).return_token_ids
    with pytest.raises(RequestError, match="return_token_ids is not supported with streaming"):
        parse_chat_request({**body, "stream": True}, None, 1000)
