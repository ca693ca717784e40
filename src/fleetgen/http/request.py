"""Every chat request fleetgen sends is built here: `run`'s (a job's), `bench`'s (greedy, or a job file's
sampling with bench's own lengths) and `up`'s verify probe.

A body has two halves. The request's own fields (`REQUEST_FIELDS`: model, messages, max_tokens, stream, the
stream's options, ignore_eos) are the caller's: those it sets, nothing in a sampling overrides. The sampling
(`Sampling`: temperature, top-p/k, thinking, the seed, a job file's `extra_body` over them) decides which
tokens the model writes; `run` and `bench --job` hand the same job's `Sampling` to the same builder, so a
sweep samples exactly as the job's requests do.

`ChatRequests` builds the shared part once; each body is a dict copy plus messages and the sample's seed
(the job's hot path: one per completion).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

# The fields a request sets itself (`ChatRequests`); where it sets one, a sampling's `extra_body` naming it
# is overridden (`--max-tokens` is the job's length whatever extra_body says; bench keeps its lengths).
REQUEST_FIELDS = (
    "model",
    "messages",
    "max_tokens",
    "stream",
    "stream_options",
    "ignore_eos",
    "return_token_ids",
)


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the model draws its tokens, as a chat body says it. The default is greedy (a bench sweep
    without a job file, the verify probe)."""

    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    # The chat template's `enable_thinking`; None leaves the template's default.
    thinking: bool | None = None
    # SGLang's switch for returning the reasoning apart; vLLM accepts unknown fields and ignores them
    # (logged at debug level only), so one body fits both engines.
    separate_reasoning: bool = False
    seed: int | None = None  # the first sample's: sample k sends seed + k, each reproducible, all different
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # a job file's fields, over the ones above

    def fields(self, sample: int = 0) -> dict[str, Any]:
        """The body fields this sampling sets for sample `sample` (its seed is the only one that differs)."""
        out: dict[str, Any] = {"temperature": self.temperature}
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.top_k is not None:
            out["top_k"] = self.top_k
        if self.separate_reasoning:
            out["separate_reasoning"] = True
        if self.thinking is not None:
            out["chat_template_kwargs"] = {"enable_thinking": self.thinking}
        out.update(self.extra_body)
        if self.seed is not None:
            out["seed"] = self.seed + sample
        return out


GREEDY = Sampling()

# The probe: one short greedy request that shows a server takes work (`up`'s verify, `status`, a drained
# endpoint's way back into a job); thinking off, so the few tokens go to the answer.
PROBE_PROMPT = "Count: one two three four, one two three four, one two three four, one two three four,"
PROBE_SAMPLING = Sampling(thinking=False)


class ChatRequests:
    """The bodies of a series of chat requests that differ only in their messages (and sample): one model,
    one length, one sampling. `stream` asks for a stream with usage in its last event; `ignore_eos` for
    exactly `max_tokens` tokens (bench's lengths); `return_token_ids` for the prompt's and the answer's
    token ids beside the text (a job's: the export trains on the exact tokens; vLLM ≥ 0.10.2 and SGLang
    0.5.23 both name the switch so, and neither takes it on a stream)."""

    __slots__ = ("_base", "_seed")

    def __init__(
        self,
        model: str,
        max_tokens: int,
        sampling: Sampling = GREEDY,
        *,
        stream: bool = False,
        ignore_eos: bool = False,
        return_token_ids: bool = False,
    ) -> None:
        base = sampling.fields()
        if sampling.seed is not None:
            del base["seed"]  # set per sample, in `body`
        base.update(model=model, max_tokens=max_tokens, stream=stream)
        if stream:
            base["stream_options"] = {"include_usage": True}
        if ignore_eos:
            base["ignore_eos"] = True
        if return_token_ids:
            base["return_token_ids"] = True
        self._base = base
        self._seed = sampling.seed

    def body(self, messages: list[Message], sample: int = 0) -> dict[str, Any]:
        """One request's body: the shared fields, `messages`, and sample `sample`'s seed."""
        body = dict(self._base)
        body["messages"] = messages
        if self._seed is not None:
            body["seed"] = self._seed + sample
        return body


def probe_body(model: str, max_tokens: int) -> dict[str, Any]:
    """The probe's body (`PROBE_PROMPT`, greedy, thinking off) for `model`, `max_tokens` long."""
    return ChatRequests(model, max_tokens, PROBE_SAMPLING).body([{"role": "user", "content": PROBE_PROMPT}])
