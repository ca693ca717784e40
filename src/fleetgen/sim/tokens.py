"""The token ids SGLang returns with `return_token_ids` (0.5.23: `ChatCompletionResponseChoice`'s
`prompt_token_ids` and `response_token_ids`, non-stream only), for a sim whose `--tokenizer-path` (by
default its `--model-path`) is a model folder with a `tokenizer.json` and a chat template: the prompt
rendered with that template and tokenized as SGLang tokenizes it; the answer's raw text (reasoning,
`</think>`, answer, as the model writes it before the reasoning parser splits it) tokenized, with the
end-of-sequence id where it stopped. A sim without such a folder returns none (as an engine that cannot:
the export then tokenizes the text).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fleetgen.chattemplate import TOKENIZER_FILE, ChatTemplate, ModelTokens
from fleetgen.errors import ModelCardError
from fleetgen.sim.text import THINK_END, Generation

THINK_OPEN = "<think>\n"


@dataclasses.dataclass(frozen=True)
class SimTokens:
    """A model folder's template and tokenizer, as the sim's tokenizer manager."""

    template: ChatTemplate
    tokens: ModelTokens

    @classmethod
    def load(cls, tokenizer_path: str | None) -> SimTokens | None:
        """The folder's template and tokenizer; None where it has not both (the default, a laptop's sim)."""
        folder = Path(tokenizer_path or "")
        if not tokenizer_path or not (folder / TOKENIZER_FILE).is_file():
            return None
        try:
            return cls(ChatTemplate.read(folder), ModelTokens(folder / TOKENIZER_FILE))
        except ModelCardError:
            return None

    def ids(
        self, messages: list[dict[str, Any]], thinking: bool, gen: Generation
    ) -> tuple[list[int], list[int]]:
        """(prompt ids, generated ids) of one choice."""
        prompt = self.template.render(messages, add_generation_prompt=True, thinking=thinking)
        raw = gen.content
        if gen.reasoning is not None:  # the parser split it: the raw text had both parts
            opened = "" if prompt.endswith(THINK_OPEN) else THINK_OPEN
            raw = f"{opened}{gen.reasoning}\n{THINK_END}\n\n{gen.content}"
        output = self.tokens.encode(raw)
        eos = self.template.special.get("eos_token")
        if gen.finish_reason == "stop" and eos:
            output += self.tokens.encode(eos)
        return self.tokens.encode(prompt), output
