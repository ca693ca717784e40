"""`http.client`: completions and stream events normalised across engines, any event read without raising,
the failure kinds."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.http.client import RequestFailed, parse_completion, parse_event


def _body(message: dict[str, Any], finish: Any = "stop", usage: Any = None) -> bytes:
    return orjson.dumps({"choices": [{"message": message, "finish_reason": finish}], "usage": usage})


def test_completions_normalize_across_engines() -> None:
    vllm = parse_completion(
        _body({"content": "a", "reasoning": "r"}, usage={"prompt_tokens": 3, "completion_tokens": 4}), "u"
    )
    sglang = parse_completion(_body({"content": "a", "reasoning_content": "r"}, {"type": "length"}), "u")
    assert (vllm.reasoning_content, vllm.prompt_tokens, vllm.completion_tokens) == ("r", 3, 4)
    assert (sglang.reasoning_content, sglang.finish_reason, sglang.prompt_tokens) == ("r", "length", None)
    empty = parse_completion(_body({"content": None}, None), "u")
    assert (empty.content, empty.reasoning_content, empty.finish_reason) == ("", "", "unknown")
    with pytest.raises(RequestFailed) as aborted:
        parse_completion(_body({"content": ""}, "abort"), "u")
    assert aborted.value.is_retryable
    with pytest.raises(RequestFailed):
        parse_completion(b"<html>", "u")


def test_token_ids_are_read_where_each_engine_puts_them() -> None:
    """vLLM 0.32 (`return_token_ids`): the prompt's ids in the body, the answer's in the choice as
    `token_ids`; SGLang 0.5.23: both in the choice, `prompt_token_ids` and `response_token_ids`. Anything
    else (none, or not a list of ints) is no ids."""
    choice = {"message": {"content": "a"}, "finish_reason": "stop", "token_ids": [5, 6]}
    vllm = orjson.dumps({"choices": [choice], "prompt_token_ids": [1, 2]})
    sglang = orjson.dumps(
        {
            "choices": [
                {
                    "message": {"content": "a"},
                    "finish_reason": "stop",
                    "prompt_token_ids": [1, 2],
                    "response_token_ids": [5, 6],
                }
            ]
        }
    )
    for raw in (vllm, sglang):
        done = parse_completion(raw, "u")
        assert (done.prompt_token_ids, done.token_ids) == ([1, 2], [5, 6])
    plain = parse_completion(_body({"content": "a"}), "u")
    assert (plain.prompt_token_ids, plain.token_ids) == (None, None)
    odd = parse_completion(
        orjson.dumps({"choices": [{"message": {}, "token_ids": ["5"]}], "prompt_token_ids": [True]}), "u"
    )
    assert (odd.prompt_token_ids, odd.token_ids) == (None, None)


def test_stream_events_normalize_across_engines() -> None:
    vllm = parse_event({"choices": [{"delta": {"reasoning": "r"}}]})
    sglang = parse_event({"choices": [{"delta": {"reasoning_content": "r", "content": None}}]})
    assert vllm == sglang and (vllm.reasoning_content, vllm.content, vllm.has_text) == ("r", "", True)
    last = parse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": None}})
    assert (last.prompt_tokens, last.completion_tokens, last.has_text) == (3, 0, False)
    role = parse_event({"choices": [{"delta": {"role": "assistant"}}], "usage": None})
    assert not role.has_text and role.completion_tokens is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=9), inner, max_size=3),
    max_leaves=8,
)


@given(
    event=JSON | st.fixed_dictionaries({"choices": st.lists(JSON, max_size=2), "usage": JSON}),
    delta=st.dictionaries(st.sampled_from(["content", "reasoning", "reasoning_content", "role"]), JSON),
)
def test_any_stream_event_reads_without_raising(event: Any, delta: dict[str, Any]) -> None:
    """A server's odd event is an event without text, never a crash of the sweep."""
    assert isinstance(parse_event(event).content + parse_event(event).reasoning_content, str)
    texts = [v for k, v in delta.items() if k != "role"]
    read = parse_event({"choices": [{"delta": delta}]})
    if all(isinstance(v, str) or v is None for v in texts):
        assert read.has_text == any(texts)


def test_failure_kinds() -> None:
    text = "HTTP 400: This model's maximum context length is 2048 tokens"
    too_long = RequestFailed(text, url="u", status=400, is_retryable=False)
    assert too_long.kind == "prompt_too_long"
    assert RequestFailed("x", url="u", is_retryable=True, is_connection=True).kind == "connection"
