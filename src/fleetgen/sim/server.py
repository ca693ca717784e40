"""The simulated HTTP surface (aiohttp), route for route as SGLang 0.5.23's `entrypoints/http_server.py`.

Health endpoints answer 503 until warmup is done; `--api-key` guards every route except `/health*`,
`/ready*` and `/metrics*` (401 `{"error": "Unauthorized"}`); `/metrics` exists only with `--enable-metrics`;
unknown routes answer FastAPI's `{"detail": "Not Found"}`. With `--log-requests` each chat request is logged
as `Receive: obj=` and the JSON body received (SGLang logs its own `GenerateReqInput` there), so tests can
read what a client sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from fleetgen.sim import chat
from fleetgen.sim.engine import Progress
from fleetgen.sim.faults import CONTROL_PATH, Action, parse_fault
from fleetgen.sim.metrics import render_metrics
from fleetgen.sim.sampling import RequestError
from fleetgen.sim.state import SimState
from fleetgen.sim.text import (
    Directives,
    Generation,
    Shape,
    estimate_prompt_tokens,
    generate,
    parse_directives,
    with_digest,
)
from fleetgen.sim.text import pick_variant as _pick_variant

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
request_logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")
STATE: web.AppKey[SimState] = web.AppKey("state", SimState)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), status=status, content_type="application/json")


def _error(message: str, err_type: str, code: int) -> web.Response:
    return web.Response(
        body=chat.error_body(message, err_type, code), status=code, content_type="application/json"
    )


@web.middleware
async def auth_and_404(request: web.Request, handler: Handler) -> web.StreamResponse:
    """SGLang's API-key middleware, then FastAPI's 404 body for unknown routes."""
    api_key = request.app[STATE].args["api_key"]
    if api_key and not request.path.startswith(OPEN_PREFIXES) and request.method != "OPTIONS":
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token, api_key):
            return _json({"error": "Unauthorized"}, 401)
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, 405)


@web.middleware
async def faulted(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The whole-server fault on (`sim/faults.py`): serve, answer 500/503, drop, or hold the request."""
    fault = request.app[STATE].fault
    action = fault.action(request.path)
    if action is Action.SERVE:
        return await handler(request)
    if action is Action.HOLD:
        await fault.held(request.path)
    elif action is not Action.DROP:
        status = HTTPStatus(500 if action is Action.ANSWER_500 else 503)
        why = f"Simulated {status.value} {status.phrase} (fleetgen.sim fault {fault.mode.value})."
        return _error(why, status.name, status.value)
    # drop, or a held request whose fault ended: the connection closed without an answer
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=HTTPStatus.INTERNAL_SERVER_ERROR)  # never sent: the transport is closed


async def set_fault(request: web.Request) -> web.Response:
    """`POST /sim/fault` `{"mode": …, "seconds": N | null}` (a SIMULATION control, see `sim/faults.py`)."""
    fault = request.app[STATE].fault
    try:
        mode, seconds = parse_fault(await request.json())
    except ValueError as exc:  # not JSON, or not a fault
        return _error(str(exc), "BadRequestError", 400)
    fault.set(mode, seconds)
    logger.warning(f"SIMULATION: fault {mode.value} for {'ever' if seconds is None else f'{seconds} s'}")
    return await get_fault(request)


async def get_fault(request: web.Request) -> web.Response:
    """`GET /sim/fault`: the fault on and the seconds it still lasts (null: until changed)."""
    fault = request.app[STATE].fault
    return _json({"mode": fault.mode.value, "seconds": fault.seconds_left})


async def health(request: web.Request) -> web.Response:
    """`/health`, `/health_generate`, `/ready`: 503 while starting, 200 once warm."""
    return web.Response(status=200 if request.app[STATE].is_ready else 503)


def _warn_if_deprecated(request: web.Request, old: str, new: str) -> None:
    """SGLang still serves the old path, with a warning in its log."""
    if request.path == old:
        logger.warning(
            f"Endpoint '{old}' is deprecated and will be removed in a future version. "
            f"Please use '{new}' instead."
        )


async def server_info(request: web.Request) -> web.Response:
    """`/server_info` (and the deprecated `/get_server_info`)."""
    _warn_if_deprecated(request, "/get_server_info", "/server_info")
    return _json(request.app[STATE].server_info())


async def model_info(request: web.Request) -> web.Response:
    """`/model_info` (and the deprecated `/get_model_info`)."""
    _warn_if_deprecated(request, "/get_model_info", "/model_info")
    return _json(request.app[STATE].model_info())


async def models(request: web.Request) -> web.Response:
    """`/v1/models`."""
    return _json(request.app[STATE].models())


async def loads(request: web.Request) -> web.Response:
    """`/v1/loads`."""
    return _json(request.app[STATE].loads())


async def metrics(request: web.Request) -> web.Response:
    """`/metrics` (mounted only with --enable-metrics)."""
    state = request.app[STATE]
    text = render_metrics(state.scheduler, state.served_model_name, state.capacity.max_total_num_tokens)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


def _injected_error(state: SimState, directives: Directives, key: str) -> web.Response | None:
    """The HTTP error a `[[sim:status=…]]` directive asks for, the first `times` times a message is seen."""
    if directives.status is None or state.injected[key] >= directives.times:
        return None
    state.injected[key] += 1
    status = HTTPStatus(directives.status)
    err_type = "BadRequestError" if status == HTTPStatus.BAD_REQUEST else status.name
    return _error(
        f"Simulated {status.value} {status.phrase} (fleetgen.sim directive).", err_type, status.value
    )


def _generations(state: SimState, req: chat.ChatRequest, directives: Directives) -> list[Generation]:
    args, knobs = state.args, state.knobs
    total = directives.tokens if directives.tokens is not None else knobs.output_tokens
    if req.ignore_eos and req.max_tokens:  # no end of sequence: the answer runs to max_tokens
        total = req.max_tokens
    separate = args["reasoning_parser"] is not None and req.separate_reasoning
    gens = [
        generate(
            Shape(
                variant=_pick_variant(req.seed, i),
                total_tokens=total,
                max_tokens=req.max_tokens,
                thinking=req.enable_thinking,
                separate=separate,
                reasoning_fraction=knobs.reasoning_fraction,
                force_length=directives.finish == "length" or (total == req.max_tokens and req.ignore_eos),
                stream_interval=args["stream_interval"],
            )
        )
        for i in range(req.n)
    ]
    return [with_digest(g, req.prompt_texts) for g in gens] if knobs.answer_digest else gens


def context_refusal(prompt: int, max_tokens: int | None, context_len: int) -> str | None:
    """SGLang's refusal of a request past the context (`TokenizerManager._validate_one_request`, 0.5.15:
    the input alone, then input + max_new_tokens; no auto-truncation), in its words; None when it fits."""
    if prompt >= context_len:
        return (
            f"The input ({prompt} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    if max_tokens is not None and prompt + max_tokens > context_len:
        return (
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {prompt + max_tokens} tokens: {prompt} tokens from the input messages "
            f"and {max_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )
    return None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/chat/completions`, non-stream and SSE."""
    state = request.app[STATE]
    try:
        payload = await request.json()
        if state.args["log_requests"]:  # SGLang prints its GenerateReqInput; the sim, the body it received
            request_logger.info("Receive: obj=%s", json.dumps(payload, sort_keys=True))
        req = chat.parse_chat_request(
            payload, state.args["default_chat_template_kwargs"], state.shape.vocab_size
        )
    except ValueError as exc:  # not JSON
        return _error(str(exc), HTTPStatus.BAD_REQUEST.phrase, 400)
    except RequestError as exc:
        return _error(str(exc), exc.err_type, 400)
    user_text = "\n".join(req.user_texts)
    directives = parse_directives(user_text)
    injected = _injected_error(state, directives, hashlib.sha256(user_text.encode()).hexdigest())
    if injected is not None:
        return injected
    prompt = estimate_prompt_tokens(req.all_texts)
    refused = context_refusal(prompt, req.max_tokens, state.args["context_length"])
    if refused is not None:
        return _error(refused, "BadRequestError", 400)
    state.scheduler.arrive()
    gens = _generations(state, req, directives)
    if directives.delay > 0:
        await asyncio.sleep(directives.delay)
    req_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    lengths = [g.completion_tokens for g in gens]
    max_new = req.max_tokens or max(1, state.args["context_length"] - prompt)
    async with state.scheduler.running(prompt, lengths, max_new, req.stream) as progress:
        if req.stream:
            return await _stream(request, state, req, gens, (req_id, created, prompt), progress)
        async for _ in progress.updates():
            pass
        if progress.aborted is not None:
            return _error(progress.aborted, "InternalServerError", 500)
        ids = None
        if req.return_token_ids and state.tokens is not None:
            ids = [state.tokens.ids(req.messages, req.enable_thinking, g) for g in gens]
        body = chat.chat_response(req_id, created, req.model, gens, prompt, state.shape.eos_token_id, ids)
        return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    state: SimState,
    req: chat.ChatRequest,
    gens: list[Generation],
    ids: tuple[str, int, int],
    progress: Progress,
) -> web.StreamResponse:
    """SSE: role chunk, reasoning/content deltas as decode progresses, finish chunks, usage, [DONE]."""
    req_id, created, prompt = ids
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    head = chat.stream_head(req_id, created, req.model)
    eos = state.shape.eos_token_id
    sent = [0] * len(gens)
    interval = max(1, state.args["stream_interval"])
    await response.write("".join(chat.stream_first(head, i) for i in range(len(gens))).encode())
    async for counts in progress.updates():
        parts = []
        for i, (gen, released) in enumerate(zip(gens, counts, strict=True)):
            pieces = chat.num_stream_pieces(gen)
            due = pieces if released >= gen.completion_tokens else min(released // interval, pieces)
            parts.append(chat.stream_pieces(head, i, gen, sent[i], due))
            sent[i] = due
        await response.write("".join(parts).encode())
    tail = [chat.stream_finish(head, i, gen, eos) for i, gen in enumerate(gens)]
    if req.include_usage or state.args["stream_response_default_include_usage"]:
        tail.append(chat.stream_usage(req_id, created, req.model, prompt, gens))
    tail.append("data: [DONE]\n\n")
    await response.write("".join(tail).encode())
    await response.write_eof()
    return response


def build_app(state: SimState) -> web.Application:
    """The aiohttp application for one simulated server."""
    app = web.Application(middlewares=[faulted, auth_and_404], client_max_size=64 * 2**20)
    app[STATE] = state
    for path in ("/health", "/health_generate", "/ready"):
        app.router.add_get(path, health)
    for path, handler in (
        ("/server_info", server_info),
        ("/get_server_info", server_info),
        ("/model_info", model_info),
        ("/get_model_info", model_info),
        ("/v1/models", models),
        ("/v1/loads", loads),
    ):
        app.router.add_get(path, handler)
    if state.args["enable_metrics"]:
        app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post(CONTROL_PATH, set_fault)  # the sim's own: a real engine has no such route
    app.router.add_get(CONTROL_PATH, get_fault)
    return app
