"""The token rows of a training export: the sequence the target served, and SpecForge's loss mask over it.

`TokenBuilder.row(result)` is one conversation as `input_ids` + `loss_mask`, the shape SpecForge's online
training reads pre-tokenized (`data.prompts_path`: `specforge.data.prompt_builder`, a JSONL row with both):

- **the ids**: the last turn's prompt as the engine tokenized it and the ids it generated, where the run
  stored them (`return_token_ids`: exact, never tokenized again); else the prompt rendered with the job's
  recorded chat template (`chattemplate.ChatTemplate`, the thinking mode the job ran) and the answer's text
  as the model writes it (reasoning, `</think>`, answer), each tokenized with the model's `tokenizer.json`
  and decoded back: a row whose tokens do not decode to the stored text is dropped and counted
  (`NO_ROUND_TRIP`), never kept. A turn that stopped is closed with the template's end of turn (the part
  the engine did not generate, e.g. the newline after `<|im_end|>`), as the template renders a finished
  turn; a truncated one is left open.
- **the mask**: SpecForge's rule (`GeneralParser.parse`: every assistant span, from after the assistant
  header through the end of turn, or to the end), laid over each token's bytes (`loss_mask`), with the
  header and end of turn probed from the same template (`ChatTemplate.markers`).

A conversation's earlier answers are in the prompt as the engine rendered them (their text, the template
deciding what of their reasoning it keeps): what the target saw when it wrote the last one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from fleetgen.chattemplate import TOKENIZER_FILE, ChatTemplate, ModelTokens, TurnMarkers
from fleetgen.generate.ledger import tokenids
from fleetgen.generate.ledger.schema import ResultRow
from fleetgen.generate.work import text_of

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
NO_ROUND_TRIP = (
    "its text tokenized with the model's tokenizer.json does not decode back to the stored text "
    "(no exact ids stored for it)"
)
NO_ASSISTANT = "no assistant span under the template's markers (nothing to train on)"


@dataclass(frozen=True)
class TokenRow:
    """One conversation's tokens and loss mask; `is_exact`: the engine's own ids."""

    input_ids: list[int]
    loss_mask: list[int]
    is_exact: bool


def loss_mask(token_bytes: Sequence[bytes], markers: TurnMarkers) -> list[int]:
    """1 for each token that overlaps an assistant span of the sequence's text (`TurnMarkers.spans`)."""
    ends: list[int] = []
    total = 0
    for piece in token_bytes:
        total += len(piece)
        ends.append(total)
    mask = [0] * len(ends)
    for start, end in markers.spans(b"".join(token_bytes)):
        first = bisect.bisect_right(ends, start)  # the first token ending past the span's start
        last = bisect.bisect_left(ends, end)  # the token holding the span's last byte
        for i in range(first, min(last + 1, len(mask))):
            mask[i] = 1
    return mask


class TokenBuilder:
    """Token rows with one model folder's template and tokenizer, for a job run with `thinking` on or off."""

    def __init__(self, folder: Path, thinking: bool) -> None:
        self.template = ChatTemplate.read(folder)
        self.tokens = ModelTokens(folder / TOKENIZER_FILE)
        self.thinking = thinking
        self.markers = self.template.markers(thinking)

    def row(self, result: ResultRow) -> TokenRow | str:
        """The row's tokens and mask, or why it is dropped."""
        stored = tokenids.unpack(result.token_ids) if result.token_ids else None
        if stored is not None:
            ids, is_exact = [*stored.prompt, *stored.output], True
        else:
            tokenized = self._tokenized(result)
            if tokenized is None:
                return NO_ROUND_TRIP
            ids, is_exact = tokenized, False
        if result.finish_reason == "stop":
            ids += self._closing(ids)
        mask = loss_mask(self.tokens.token_bytes(ids), self.markers)
        if not any(mask):
            return NO_ASSISTANT
        return TokenRow(ids, mask, is_exact)

    def _tokenized(self, result: ResultRow) -> list[int] | None:
        """The last turn's prompt and answer as the engine would have tokenized them; None where the tokens
        do not decode back to the text."""
        turns = turns_of(result)
        history: list[dict[str, Any]] = []
        for k, segment in enumerate(orjson.loads(result.prompt)):
            if k:
                history.append({"role": "assistant", "content": turns[k - 1][0]})
            history.extend({"role": m["role"], "content": text_of(m["content"])} for m in segment)
        prompt = self.template.render(history, add_generation_prompt=True, thinking=self.thinking)
        content, reasoning = turns[-1]
        answer = content
        if reasoning:
            opened = "" if prompt.endswith(THINK_OPEN) else THINK_OPEN
            answer = f"{opened}{reasoning}{THINK_CLOSE}{content}"
        pieces = [self.tokens.encode(prompt), self.tokens.encode(answer)]
        if any(self.tokens.decode(p) != text for p, text in zip(pieces, (prompt, answer), strict=True)):
            return None
        return pieces[0] + pieces[1]

    def _closing(self, ids: list[int]) -> list[int]:
        """The ids that close a finished turn as the template does: the part of its end of turn the sequence
        does not end with (all of it where the engine kept no end-of-sequence token)."""
        end_of_turn = self.markers.end_of_turn
        tail = self.tokens.decode(ids[-8:])
        done = max((k for k in range(len(end_of_turn), 0, -1) if tail.endswith(end_of_turn[:k])), default=0)
        return self.tokens.encode(end_of_turn[done:]) if done < len(end_of_turn) else []


def turns_of(row: ResultRow) -> list[tuple[str, str]]:
    """(content, reasoning) of every turn of a stored row."""
    if row.turns:
        return [(t["content"], t["reasoning_content"]) for t in orjson.loads(row.turns)]
    return [(row.content or "", row.reasoning_content or "")]


def row_id(row: ResultRow) -> str:
    """A training row's id: the record's, with `-sN` for its sample N > 0."""
    return row.id if row.sample == 0 else f"{row.id}-s{row.sample}"
