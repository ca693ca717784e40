"""fleetgen.sim answers a chat request's sampling fields as SGLang 0.5.23 does (`SamplingParams.verify` in
`sampling/sampling_params.py`, after the pydantic model and `normalize`): the same refusals, in the same
order, with the same words; every value SGLang takes is taken."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.sim.chat import parse_chat_request
from fleetgen.sim.sampling import RequestError

VOCAB = 248320
MESSAGES = [{"role": "user", "content": "hi"}]
# SGLang's accepted ranges, written out here independently of the sim's table
IN_RANGE: dict[str, Callable[[float], bool]] = {
    "temperature": lambda v: v >= 0,
    "top_p": lambda v: 0 < v <= 1,
    "min_p": lambda v: 0 <= v <= 1,
    "frequency_penalty": lambda v: -2 <= v <= 2,
    "presence_penalty": lambda v: -2 <= v <= 2,
    "repetition_penalty": lambda v: 0 < v <= 2,
}


def answer(**fields: Any) -> tuple[str, str] | None:
    """(message, type) of the sim's refusal, or None when it accepts."""
    try:
        parse_chat_request({"messages": MESSAGES, **fields}, None, VOCAB)
    except RequestError as exc:
        return str(exc), exc.err_type
    return None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_p": 5}, "top_p must be in (0, 1], got 5.0."),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0."),
        ({"temperature": -0.5}, "temperature must be a non-negative finite number, got -0.5."),
        ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"top_k": -2}, "top_k must be -1 (disable) or at least 1, got -2."),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be in [-2, 2], got 2.5."),
        ({"presence_penalty": -3}, "presence_penalty must be in [-2, 2], got -3.0."),
        ({"repetition_penalty": 0}, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 0.0."),
        ({"min_tokens": -1}, "min_new_tokens must be in [0, max_new_tokens], got -1."),
        ({"max_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"max_completion_tokens": -3, "max_tokens": 10}, "max_new_tokens must be at least 0, got -3."),
        ({"min_tokens": 20, "max_tokens": 10}, "min_new_tokens must be in [0, max_new_tokens(10)], got 20."),
        ({"logit_bias": {"248320": 1.0}}, "logit_bias must has keys in [0, 248319], got 248320."),
        ({"logit_bias": {"x": 1.0}}, "invalid literal for int() with base 10: 'x'"),
        ({"seed": 2**63}, f"sampling_seed must be in [-2**63, 2**63 - 1], got {2**63}."),
        # verify's order: temperature before top_p before top_k
        ({"top_p": 5, "temperature": -1}, "temperature must be a non-negative finite number, got -1.0."),
        ({"top_k": 0, "top_p": 5}, "top_p must be in (0, 1], got 5.0."),
    ],
)
def test_out_of_range_values_get_sglangs_message(fields: dict[str, Any], message: str) -> None:
    assert answer(**fields) == (message, "BadRequestError")


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"temperature": 0, "top_k": 0},  # temperature 0 is greedy: normalize sets top_k to 1 first
        {"top_k": -1, "top_p": 1, "min_p": 0, "repetition_penalty": 2},
        {"temperature": None, "top_p": None, "top_k": None, "min_p": None, "repetition_penalty": None},
        {"max_tokens": 0},  # `max_completion_tokens or max_tokens`: 0 reaches verify as 0, which it allows
        {"max_completion_tokens": 0, "max_tokens": 5, "min_tokens": 5},
        {"logit_bias": {"0": -100, "248319": 5}},
        {"seed": -(2**63)},
    ],
)
def test_values_sglang_takes_are_taken(fields: dict[str, Any]) -> None:
    assert answer(**fields) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_p": "high"}, "top_p: Input should be a valid number"),
        ({"top_k": 2.5}, "top_k: Input should be a valid integer, got a number with a fractional part"),
        ({"frequency_penalty": None}, "frequency_penalty: Input should be a valid number"),
        ({"min_tokens": None}, "min_tokens: Input should be a valid integer"),
        ({"temperature": True}, "temperature: Input should be a valid number"),
        ({"logit_bias": [1]}, "logit_bias: Input should be a valid dictionary"),
        # the pydantic model refuses a type before verify looks at another field's range
        ({"top_p": 5, "seed": "x"}, "seed: Input should be a valid integer"),
    ],
)
def test_wrong_types_are_the_pydantic_models_bad_request(fields: dict[str, Any], message: str) -> None:
    assert answer(**fields) == (message, "Bad Request")


def test_empty_messages_are_refused_before_sampling_is_verified() -> None:
    with pytest.raises(RequestError, match=r"^Messages cannot be empty\.$"):
        parse_chat_request({"messages": [], "top_p": 5}, None, VOCAB)


@given(
    field=st.sampled_from(sorted(IN_RANGE)),
    value=st.one_of(
        st.floats(-5, 5, allow_nan=False), st.integers(-5, 5), st.sampled_from([0.0, 1.0, 2.0, -2.0, 1e-7])
    ),
)
def test_a_float_field_is_refused_exactly_outside_sglangs_range(field: str, value: float) -> None:
    result = answer(**{field: value})
    if field == "temperature" and 0 <= value < 1e-6:
        assert result is None  # greedy
    elif IN_RANGE[field](value):
        assert result is None
    else:
        assert (
            result is not None
            and result[0].startswith(f"{field} must be ")
            and result[1] == "BadRequestError"
        )
        assert result[0].endswith(f", got {float(value)}.")


@given(top_k=st.integers(-10, 10**9))
def test_top_k_is_refused_below_one_except_minus_one(top_k: int) -> None:
    assert (answer(top_k=top_k) is None) == (top_k >= 1 or top_k == -1)
