"""The sim's refusals in SGLang's words (`sim.server.context_refusal`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetgen.sim.server import context_refusal


@given(st.integers(1, 10_000), st.none() | st.integers(1, 10_000), st.integers(2, 10_000))
def test_a_request_is_refused_exactly_when_it_does_not_fit_the_context(
    prompt: int, max_tokens: int | None, context: int
) -> None:
    """SGLang 0.5.15 refuses the input alone at the context, and input + max_new_tokens past it; a request
    without max_tokens is sized by the server (it fits whenever its input does)."""
    refused = context_refusal(prompt, max_tokens, context)
    fits = prompt < context and (max_tokens is None or prompt + max_tokens <= context)
    assert (refused is None) == fits
    if refused is not None and prompt < context:
        assert refused.startswith("Requested token count exceeds the model's maximum context length")
        assert f"{prompt} tokens from the input messages and {max_tokens} tokens" in refused
