"""OpenAI-compatible bodies in SGLang 0.5.23's shapes (`entrypoints/openai/protocol.py`, `sse_utils.py`).

Non-stream: `ChatCompletionResponse` (id `chatcmpl-<hex>`, choices with `message.role/content/
reasoning_content`, `finish_reason`, `matched_stop` = the EOS id on "stop"), `usage` with `reasoning_tokens`
and `completion_tokens_details`, `metadata.weight_version`. Stream: a first chunk with role "assistant" and
content "", `reasoning_content` deltas, `content` deltas, one finish chunk per choice, optional usage chunk,
then `data: [DONE]`. Bodies are assembled from cached JSON fragments: the simulator must be cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from fleetgen.sim.sampling import RequestError, sampling_values, verify_sampling
from fleetgen.sim.text import Generation

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
DEFAULT_MODEL_NAME = "default"


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat request the simulator acts on."""

    model: str
    user_texts: list[str]
    all_texts: list[str]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int
    seed: int | None
    separate_reasoning: bool
    enable_thinking: bool
    ignore_eos: bool = False  # SGLang's sampling field: write on past the end, to max_tokens
    prompt_texts: list[str] = dataclasses.field(default_factory=list)  # system and user texts, in order
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # role and text, as sent
    return_token_ids: bool = False


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "…"}, …]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _thinking(body: dict[str, Any], server_default: dict[str, Any] | None) -> bool:
    """`chat_template_kwargs.enable_thinking` (or `thinking`) wins over the server default; on by default."""
    kwargs = body.get("chat_template_kwargs")
    for source in (kwargs, server_default):
        if isinstance(source, dict):
            for key in ("enable_thinking", "thinking"):
                if key in source:
                    return bool(source[key])
    return True


def parse_chat_request(body: Any, server_kwargs: dict[str, Any] | None, vocab_size: int) -> ChatRequest:
    """Validate the request like SGLang: its pydantic model's types, `_validate_request`, then the sampling
    fields (`sampling.verify_sampling`, SamplingParams.verify's ranges and words)."""
    if not isinstance(body, dict):
        raise RequestError("Input should be a valid dictionary")
    messages = body.get("messages")
    if messages is None:
        raise RequestError("messages: Field required")
    if not isinstance(messages, list):
        raise RequestError("messages: Input should be a valid list")
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool):
        raise RequestError("n: Input should be a valid integer")
    sampling = sampling_values(body)
    if not messages:
        raise RequestError("Messages cannot be empty.", "BadRequestError")
    verify_sampling(sampling, vocab_size)
    if n < 1:
        raise RequestError("n must be positive")
    if body.get("return_token_ids") and body.get("stream"):
        raise RequestError(
            "return_token_ids is not supported with streaming on /v1/chat/completions. Please set "
            "stream=false when using return_token_ids=true."
        )
    texts = [_text_of(m.get("content")) for m in messages if isinstance(m, dict)]
    user = [_text_of(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    options = body.get("stream_options") or {}
    return ChatRequest(
        model=str(body.get("model", DEFAULT_MODEL_NAME)),
        user_texts=user,
        all_texts=texts,
        stream=bool(body.get("stream", False)),
        include_usage=bool(options.get("include_usage", False)),
        max_tokens=sampling["max_new_tokens"],
        n=n,
        seed=sampling["seed"],
        separate_reasoning=bool(body.get("separate_reasoning", True)),
        enable_thinking=_thinking(body, server_kwargs),
        ignore_eos=bool(body.get("ignore_eos", False)),
        prompt_texts=[
            _text_of(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") in ("system", "user")
        ],
        messages=[
            {"role": m.get("role"), "content": _text_of(m.get("content"))}
            for m in messages
            if isinstance(m, dict)
        ],
        return_token_ids=bool(body.get("return_token_ids", False)),
    )


def usage_json(prompt_tokens: int, gens: list[Generation]) -> str:
    """`UsageInfo` as SGLang serializes it."""
    completion = sum(g.completion_tokens for g in gens)
    reasoning = sum(g.reasoning_tokens for g in gens)
    details = f'{{"reasoning_tokens":{reasoning}}}' if reasoning else "null"
    return (
        f'{{"prompt_tokens":{prompt_tokens},"total_tokens":{prompt_tokens + completion},'
        f'"completion_tokens":{completion},"prompt_tokens_details":null,'
        f'"reasoning_tokens":{reasoning},"completion_tokens_details":{details}}}'
    )


@functools.lru_cache(maxsize=512)
def _message_json(gen: Generation) -> str:
    reasoning = "null" if gen.reasoning is None else _dumps(gen.reasoning)
    content = _dumps(gen.content)
    return f'{{"role":"assistant","content":{content},"reasoning_content":{reasoning},"tool_calls":null}}'


def _matched(gen: Generation, eos_id: int) -> str:
    return str(eos_id) if gen.finish_reason == "stop" else "null"


def chat_response(
    req_id: str,
    created: int,
    model: str,
    gens: list[Generation],
    prompt: int,
    eos: int,
    token_ids: list[tuple[list[int], list[int]]] | None = None,
) -> bytes:
    """A non-stream `ChatCompletionResponse` body; with `token_ids` (per choice: prompt, response) the
    choices carry `prompt_token_ids` and `response_token_ids` (return_token_ids)."""
    ids = [
        f',"prompt_token_ids":{_dumps(p)},"response_token_ids":{_dumps(r)}' for p, r in token_ids or []
    ] or [""] * len(gens)
    choices = ",".join(
        f'{{"index":{i},"message":{_message_json(g)},"logprobs":null,'
        f'"finish_reason":"{g.finish_reason}","matched_stop":{_matched(g, eos)}{ids[i]}}}'
        for i, g in enumerate(gens)
    )
    return (
        f'{{"id":"{req_id}","object":"chat.completion","created":{created},"model":{_dumps(model)},'
        f'"choices":[{choices}],"usage":{usage_json(prompt, gens)},'
        '"metadata":{"weight_version":"default"}}'
    ).encode()


@functools.lru_cache(maxsize=512)
def _deltas(gen: Generation) -> tuple[str, ...]:
    """One choice's delta objects, in msgspec `StreamDelta` field order (reasoning_content always there)."""
    reasoning = tuple(f'{{"reasoning_content":{_dumps(p)}}}' for p in gen.reasoning_pieces)
    content = tuple(f'{{"reasoning_content":null,"content":{_dumps(p)}}}' for p in gen.content_pieces)
    return reasoning + content


def _chunk_start(req_id: str, created: int, model: str) -> str:
    head = f'data: {{"id":"{req_id}","object":"chat.completion.chunk","created":{created},'
    return head + f'"model":{_dumps(model)},'


def stream_head(req_id: str, created: int, model: str) -> tuple[str, str]:
    """(prefix up to `"index":`, suffix after the delta) of every chunk of one response."""
    prefix = _chunk_start(req_id, created, model)
    return prefix + '"choices":[{"index":', ',"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'


def stream_first(head: tuple[str, str], index: int) -> str:
    """The role chunk that opens each choice."""
    return f'{head[0]}{index},"delta":{{"reasoning_content":null,"role":"assistant","content":""}}{head[1]}'


def stream_pieces(head: tuple[str, str], index: int, gen: Generation, start: int, stop: int) -> str:
    """Chunks for deltas [start, stop) of one choice, as one string."""
    opening = f'{head[0]}{index},"delta":'
    return "".join(opening + delta + head[1] for delta in _deltas(gen)[start:stop])


def num_stream_pieces(gen: Generation) -> int:
    """How many delta chunks a choice streams."""
    return len(_deltas(gen))


def stream_finish(head: tuple[str, str], index: int, gen: Generation, eos: int) -> str:
    """The chunk carrying finish_reason (and matched_stop) for one choice."""
    tail = (
        f',"logprobs":null,"finish_reason":"{gen.finish_reason}","matched_stop":{_matched(gen, eos)}}}]}}\n\n'
    )
    return f'{head[0]}{index},"delta":{{"reasoning_content":null}}{tail}'


def stream_usage(req_id: str, created: int, model: str, prompt: int, gens: list[Generation]) -> str:
    """The trailing usage chunk (`stream_options.include_usage`)."""
    return _chunk_start(req_id, created, model) + f'"choices":[],"usage":{usage_json(prompt, gens)}}}\n\n'


def error_body(message: str, err_type: str, code: int) -> bytes:
    """SGLang's `ErrorResponse`."""
    return _dumps(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": code}
    ).encode()
