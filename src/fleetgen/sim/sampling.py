"""A chat request's sampling fields checked as SGLang 0.5.23 checks them, with its exact messages.

Two stages, as in SGLang: the pydantic model (`ChatCompletionRequest`) refuses a value of the wrong type
(HTTP 400, type "Bad Request", from `validation_exception_handler`; the sim names the field and pydantic's
sentence, not its whole dump), then `SamplingParams.normalize` + `verify` (`sampling/sampling_params.py`,
raised as ValueError and answered by `create_error_response`: HTTP 400, type "BadRequestError") refuses
an out-of-range value, checking in verify's order so the first message is SGLang's first. Before verify,
as `to_sampling_params` and `normalize` do: an unset value takes its default, `max_new_tokens` is
`max_completion_tokens or max_tokens`, a temperature below 1e-6 means greedy (top_k 1), top_k -1 means the
whole vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30
# field → (default, is_float, nullable): ChatCompletionRequest's types and `_DEFAULT_SAMPLING_PARAMS`
FIELDS: dict[str, tuple[float | int | None, bool, bool]] = {
    "temperature": (1.0, True, True),
    "top_p": (1.0, True, True),
    "top_k": (-1, False, True),
    "min_p": (0.0, True, True),
    "frequency_penalty": (0.0, True, False),
    "presence_penalty": (0.0, True, False),
    "repetition_penalty": (1.0, True, True),
    "min_tokens": (0, False, False),
    "max_tokens": (None, False, True),
    "max_completion_tokens": (None, False, True),
    "seed": (None, False, True),
}


class RequestError(Exception):
    """The request is invalid: HTTP 400 with SGLang's ErrorResponse body, whose `type` is `err_type`
    ("Bad Request" from the pydantic model's handler, "BadRequestError" from the serving layer's)."""

    def __init__(self, message: str, err_type: str = "Bad Request") -> None:
        super().__init__(message)
        self.err_type = err_type


def _typed(body: dict[str, Any], name: str) -> float | int | None:
    default, is_float, nullable = FIELDS[name]
    kind = "number" if is_float else "integer"
    value = body.get(name)
    if value is None:
        if nullable or name not in body:
            return default
        raise RequestError(f"{name}: Input should be a valid {kind}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{name}: Input should be a valid {kind}")
    if is_float:
        return float(value)  # pydantic makes 5 a float: SGLang's message says "got 5.0"
    if isinstance(value, float) and not value.is_integer():
        raise RequestError(f"{name}: Input should be a valid integer, got a number with a fractional part")
    return int(value)


def _range_errors(p: dict[str, Any]) -> str | None:
    """`SamplingParams.verify`'s first refusal, in its order and words."""
    checks = (
        (
            not math.isfinite(p["temperature"]) or p["temperature"] < 0.0,
            f"temperature must be a non-negative finite number, got {p['temperature']}.",
        ),
        (not 0.0 < p["top_p"] <= 1.0, f"top_p must be in (0, 1], got {p['top_p']}."),
        (not 0.0 <= p["min_p"] <= 1.0, f"min_p must be in [0, 1], got {p['min_p']}."),
        (p["top_k"] < 1, f"top_k must be -1 (disable) or at least 1, got {p['top_k']}."),
        (
            not -2.0 <= p["frequency_penalty"] <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {p['frequency_penalty']}.",
        ),
        (
            not -2.0 <= p["presence_penalty"] <= 2.0,
            f"presence_penalty must be in [-2, 2], got {p['presence_penalty']}.",
        ),
        (
            not 0.0 < p["repetition_penalty"] <= 2.0,
            f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {p['repetition_penalty']}.",
        ),
        (p["min_tokens"] < 0, f"min_new_tokens must be in [0, max_new_tokens], got {p['min_tokens']}."),
    )
    for is_bad, message in checks:
        if is_bad:
            return message
    max_new = p["max_new_tokens"]
    if max_new is not None:
        if max_new < 0:
            return f"max_new_tokens must be at least 0, got {max_new}."
        if p["min_tokens"] > max_new:
            return f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {p['min_tokens']}."
    return None


def _logit_bias_error(bias: Any, vocab_size: int) -> str | None:
    if bias is None:
        return None
    for token_id in bias:
        try:
            token = int(token_id)
        except ValueError as exc:  # SGLang's int(token_id) raises, and the message is Python's
            return str(exc)
        if not 0 <= token < vocab_size:
            return f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}."
    return None


def sampling_values(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields as SGLang's pydantic model types them, normalized as `to_sampling_params` and
    `SamplingParams.normalize` do; raises RequestError ("Bad Request") on a value of the wrong type."""
    values: dict[str, Any] = {name: _typed(body, name) for name in FIELDS}
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise RequestError("logit_bias: Input should be a valid dictionary")
    if 0 <= values["temperature"] < SAMPLING_EPS:
        values["temperature"], values["top_k"] = 1.0, 1
    if values["top_k"] == -1:
        values["top_k"] = TOP_K_ALL
    values["max_new_tokens"] = values["max_completion_tokens"] or values["max_tokens"]
    values["logit_bias"] = bias
    return values


def verify_sampling(values: dict[str, Any], vocab_size: int) -> None:
    """Raise RequestError ("BadRequestError") with `SamplingParams.verify`'s first refusal, if any."""
    message = _range_errors(values) or _logit_bias_error(values["logit_bias"], vocab_size)
    seed = values["seed"]
    if message is None and seed is not None and not -(2**63) <= seed <= 2**63 - 1:
        message = f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}."
    if message is not None:
        raise RequestError(message, "BadRequestError")
