"""A model's chat template and tokenizer, read from its folder and applied the way the engines apply them.

vLLM and SGLang render a chat request with the tokenizer's Jinja template (transformers'
`apply_chat_template`: a sandboxed environment with `trim_blocks`, `lstrip_blocks`, `loopcontrols`, a
`tojson` filter, `raise_exception`, the special tokens as variables, `chat_template_kwargs` such as
`enable_thinking`), then tokenize the text without adding special tokens. `ChatTemplate` does the same, so the
export builds the sequence the server built (`render`), and finds its assistant spans the way SpecForge finds
them (`TurnMarkers`: the assistant header and the end of a turn, probed from the template itself).

`ModelTokens` wraps the model's `tokenizer.json` (the `tokenizers` library: no torch, no transformers): ids
from text, text from ids, and each token's bytes (`token_bytes`), which the loss mask is laid over.

The template's text comes from `chat_template.jinja` where the folder has one (transformers ≥ 4.43 writes it),
else `tokenizer_config.json`'s `chat_template` (a string, or a list of named ones: "default").
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer

from fleetgen.errors import ModelCardError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
MODEL_FILES = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE)  # what a job keeps of its model folder
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# Probe texts: no template rewrites them, no tokenizer merges them with what surrounds them.
PROBE_USER = "\x00fleetgen-user\x00"
PROBE_ASSISTANT = "\x00fleetgen-assistant\x00"


@dataclass(frozen=True)
class TurnMarkers:
    """Where an assistant turn's trained span starts and ends, as SpecForge's `ChatTemplate` says it
    (`assistant_header`, `end_of_turn_token`): the span runs from after the header through the end of turn."""

    assistant_header: str
    end_of_turn: str

    def spans(self, text: bytes) -> list[tuple[int, int]]:
        """The byte spans SpecForge's `GeneralParser` trains on in `text`: after each header, up to and
        including the next end of turn, or to the end (its regex, over bytes)."""
        pattern = re.escape(self.assistant_header.encode()) + rb"([\s\S]*?(?:"
        pattern += re.escape(self.end_of_turn.encode()) + rb"|$))"
        return [m.span(1) for m in re.finditer(pattern, text, re.DOTALL)]


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template: its text, where it was read, and the special tokens it may name."""

    text: str
    source: str
    special: Mapping[str, str]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @classmethod
    def read(cls, folder: Path) -> ChatTemplate:
        """The template of the model folder `folder`; `ModelCardError` naming the files when it has none."""
        config = _json_file(folder / CONFIG_FILE)
        special = {name: _token_text(config.get(name)) for name in SPECIAL_NAMES if config.get(name)}
        jinja_file = folder / TEMPLATE_FILE
        if jinja_file.is_file():
            return cls(jinja_file.read_text(encoding="utf-8"), str(jinja_file), special)
        text = config.get("chat_template")
        if isinstance(text, list):  # [{"name": "default", "template": …}, {"name": "tool_use", …}]
            named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
            text = named.get("default")
        if not isinstance(text, str) or not text:
            raise ModelCardError(
                f"{folder} holds no chat template (no {TEMPLATE_FILE}, no chat_template in {CONFIG_FILE})",
                fix="point at the model folder the servers load (it has the template they apply)",
                context={"folder": str(folder)},
            )
        return cls(text, str(folder / CONFIG_FILE), special)

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool, thinking: bool | None
    ) -> str:
        """The text the engine renders for `messages` (`enable_thinking` set where `thinking` is not None)."""
        kwargs: dict[str, Any] = {} if thinking is None else {"enable_thinking": thinking}
        try:
            return _compiled(self.text).render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                **self.special,
                **kwargs,
            )
        except jinja2.TemplateError as exc:
            raise ModelCardError(
                f"the chat template of {self.source} does not render: {exc}",
                fix="check the template (it is the one the servers apply), or point at another model folder",
            ) from exc

    def markers(self, thinking: bool | None) -> TurnMarkers:
        """The assistant header and end of turn, probed: a user turn rendered with the generation prompt and
        with an answer; the header is what both put after the user's end of turn, the end of turn what
        follows the answer."""
        user = {"role": "user", "content": PROBE_USER}
        opened = self.render([user], add_generation_prompt=True, thinking=thinking)
        answered = self.render(
            [user, {"role": "assistant", "content": PROBE_ASSISTANT}],
            add_generation_prompt=False,
            thinking=thinking,
        )
        after_user = answered.split(PROBE_USER, 1)[-1]
        between, _, end_of_turn = after_user.partition(PROBE_ASSISTANT)
        prompt_tail = opened.split(PROBE_USER, 1)[-1]
        common = _common_prefix(between, prompt_tail)
        header = common.removeprefix(end_of_turn) if end_of_turn else common
        if not header or PROBE_ASSISTANT not in after_user:
            raise ModelCardError(
                f"the chat template of {self.source} shows no assistant header (rendered: {answered!r})",
                fix="export in a text format (--format sharegpt) and let the trainer apply its template",
            )
        return TurnMarkers(header, end_of_turn)


class ModelTokens:
    """The model's own tokenizer (`tokenizer.json`): ids, text and the bytes of each token."""

    def __init__(self, path: Path) -> None:
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
            spec = json.loads(path.read_text(encoding="utf-8"))
        except Exception as exc:  # the library raises plain Exception (a format newer than it reads)
            raise ModelCardError(
                f"{path} does not load: {exc}", fix="point at the model folder the servers load"
            ) from exc
        self._is_byte_level = _is_byte_level(spec.get("decoder"))
        self._added = {int(t["id"]): str(t["content"]) for t in spec.get("added_tokens", [])}
        self.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """The ids of `text` as the engines tokenize a rendered prompt: no special tokens added, special
        tokens written in the text parsed as such."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, ids: Sequence[int]) -> list[bytes]:
        """Each token's bytes (a byte-level BPE token may hold part of a character); their join is the
        sequence's text. For other decoders each token's own decoded text."""
        if not self._is_byte_level:
            return [self.decode([i]).encode() for i in ids]
        table = _byte_decoder()
        out = []
        for i in ids:
            added = self._added.get(i)
            piece = self._tokenizer.id_to_token(i) if added is None else None
            if added is not None:
                out.append(added.encode())
            elif piece is None:
                raise ModelCardError(
                    f"token id {i} is not in the tokenizer's vocabulary",
                    fix="export with the model folder the job ran (its tokenizer.json)",
                )
            else:
                out.append(bytes(table[c] for c in piece))
        return out


def _is_byte_level(decoder: object) -> bool:
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(d) for d in decoder.get("decoders") or [])


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte ↔ printable-character table, inverted: a byte-level token's characters → its bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _raise(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


@functools.lru_cache(maxsize=8)
def _compiled(text: str) -> jinja2.Template:
    """The template compiled as transformers compiles it (`_compile_jinja_template`)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(text)
    except jinja2.TemplateError as exc:
        raise ModelCardError(
            f"the chat template does not compile: {exc}",
            fix="check the template (it is the one the servers apply), or point at another model folder",
        ) from exc


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelCardError(f"{path} is not readable JSON: {exc}", fix="check the model folder") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: object) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": …} (AddedToken)."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def has_template(folder: Path) -> bool:
    """Whether `folder` holds a chat template (`ChatTemplate.read` reads one)."""
    try:
        ChatTemplate.read(folder)
    except ModelCardError:
        return False
    return True
