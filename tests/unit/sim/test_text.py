"""fleetgen.sim's synthetic generations, directives and response bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.sim import chat
from fleetgen.sim.text import DIGEST_TAG, Shape, generate, parse_directives, prompt_digest, with_digest


def shape(**changes: Any) -> Shape:
    base: dict[str, Any] = dict(
        variant=1,
        total_tokens=100,
        max_tokens=None,
        thinking=True,
        separate=True,
        reasoning_fraction=0.75,
        force_length=False,
        stream_interval=1,
    )
    return Shape(**{**base, **changes})


def test_thinking_splits_reasoning_and_answer() -> None:
    gen = generate(shape())
    assert gen.completion_tokens == 100 and gen.reasoning_tokens == 75 and gen.finish_reason == "stop"
    assert gen.reasoning and len(gen.reasoning.split()) == 74  # 74 words + the </think> token
    assert len(gen.content.split()) == 25
    assert "</think>" not in gen.content


def test_thinking_off_has_no_reasoning() -> None:
    gen = generate(shape(thinking=False))
    assert gen.reasoning is None and gen.reasoning_tokens == 0
    assert len(gen.content.split()) == 100


def test_without_parser_the_raw_text_is_content() -> None:
    gen = generate(shape(separate=False))
    assert gen.reasoning is None
    assert "\n</think>\n\n" in gen.content
    assert gen.reasoning_tokens == 75


def test_max_tokens_cuts_inside_reasoning() -> None:
    gen = generate(shape(max_tokens=30))
    assert gen.finish_reason == "length" and gen.completion_tokens == 30
    assert gen.content == "" and gen.reasoning and len(gen.reasoning.split()) == 30


def test_seeded_text_is_deterministic_and_variants_differ() -> None:
    assert generate(shape(variant=7)).reasoning == generate(shape(variant=7, stream_interval=2)).reasoning
    assert generate(shape(variant=7)).reasoning != generate(shape(variant=8)).reasoning


@pytest.mark.parametrize("interval", [1, 3, 64])
def test_stream_pieces_concatenate_to_the_text(interval: int) -> None:
    gen = generate(shape(stream_interval=interval))
    assert "".join(gen.reasoning_pieces) == gen.reasoning
    assert "".join(gen.content_pieces) == gen.content


def test_directives() -> None:
    d = parse_directives("hello [[sim:status=429:times=2]] and [[sim:tokens=50]]")
    assert (d.status, d.times, d.tokens, d.finish) == (429, 2, 50, None)
    assert parse_directives("[[sim:finish=length]]").finish == "length"
    assert parse_directives("[[sim:status=418]]").status is None  # only 400/429/500/503 are injectable
    assert parse_directives("no tags").status is None


def test_non_stream_body_shape() -> None:
    gens = [generate(shape()), generate(shape(variant=2))]
    body = json.loads(chat.chat_response("chatcmpl-x", 1, "m", gens, 12, 99))
    assert body["object"] == "chat.completion" and body["model"] == "m"
    first = body["choices"][0]
    assert first["message"]["reasoning_content"] == gens[0].reasoning
    assert first["finish_reason"] == "stop" and first["matched_stop"] == 99
    assert body["usage"] == {
        "prompt_tokens": 12,
        "total_tokens": 212,
        "completion_tokens": 200,
        "prompt_tokens_details": None,
        "reasoning_tokens": 150,
        "completion_tokens_details": {"reasoning_tokens": 150},
    }


def test_stream_chunks_are_json_and_rebuild_the_text() -> None:
    gen = generate(shape(max_tokens=90))
    head = chat.stream_head("chatcmpl-x", 1, "m")
    text = chat.stream_first(head, 0) + chat.stream_pieces(head, 0, gen, 0, chat.num_stream_pieces(gen))
    text += chat.stream_finish(head, 0, gen, 99) + chat.stream_usage("chatcmpl-x", 1, "m", 5, [gen])
    events = [json.loads(line[len("data: ") :]) for line in text.split("\n\n") if line]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == gen.reasoning
    assert "".join(d.get("content") or "" for d in deltas) == gen.content
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 90


@given(st.lists(st.text(max_size=20), max_size=4), st.lists(st.text(max_size=20), max_size=4))
def test_the_answer_digest_tells_prompts_apart(one: list[str], two: list[str]) -> None:
    """`--sim-answer-digest`: two requests share a digest only when their texts are the same, in order (a
    boundary moved, `["ab", "c"]` vs `["a", "bc"]`, is another prompt)."""
    assert (prompt_digest(one) == prompt_digest(two)) == (one == two)


@given(st.integers(0, 50), st.integers(1, 40), st.none() | st.integers(1, 40), st.booleans(), st.booleans())
def test_an_answer_with_its_digest_begins_with_it_and_streams_the_same_text(
    variant: int, total: int, max_tokens: int | None, thinking: bool, separate: bool
) -> None:
    gen = generate(Shape(variant, total, max_tokens, thinking, separate, 0.5, False, 3))
    tagged = with_digest(gen, ["system", "question"])
    assert tagged.content.startswith(f"{DIGEST_TAG}{prompt_digest(['system', 'question'])}")
    assert "".join(tagged.content_pieces) == tagged.content
    assert tagged.content.endswith(gen.content)
    assert (tagged.reasoning, tagged.completion_tokens) == (gen.reasoning, gen.completion_tokens)
