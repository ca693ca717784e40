"""What an export wrote and dropped, by reason (`Tally`): the rows kept, the truncated ones, and for the
training exports each row's tokens against the trainer's `max_length` — rows over it, the trained tokens past
it, rows cut there (as SpecForge cuts: the first `max_length` tokens) or dropped — and the summary's notes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetgen.generate.export_tokens import TokenBuilder, TokenRow, row_id
from fleetgen.generate.ledger.schema import ResultRow

PAST_MAX_LENGTH = "longer than --max-length (--over-length drop)"
NOTHING_LEFT = "no trained token within --max-length (SpecForge drops a row with none)"


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote, what it dropped and why, and what it kept that a reader should know about."""

    path: str
    format: str
    rows: int
    skipped: int
    skipped_reason: str = ""
    dropped: dict[str, int] = field(default_factory=dict)  # reason → rows
    truncated_written: int = 0
    notes: list[str] = field(default_factory=list)
    max_length: int | None = None
    over_max_length: int = 0  # rows longer than max_length (cut or dropped)
    cut_at_max_length: int = 0  # rows written cut at max_length
    loss_tokens_past_max_length: int = 0  # trained (assistant) tokens past max_length, in those rows
    exact_token_rows: int = 0  # rows whose tokens are the engine's own ids
    retokenized_rows: int = 0  # rows tokenized from their text (and decoded back)


@dataclass
class Tally:
    """What an export wrote and dropped, by reason; the token rows and their lengths against max_length."""

    builder: TokenBuilder | None = None
    max_length: int | None = None
    over_length: str = "cut"
    written: int = 0
    truncated_written: int = 0
    truncated_dropped: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    over: int = 0
    cut: int = 0
    past: int = 0
    exact: int = 0
    retokenized: int = 0
    models: Counter[str] = field(default_factory=Counter)

    def kept(
        self, rows: Iterable[ResultRow], item_of: Callable[[ResultRow], dict[str, Any] | str]
    ) -> Iterator[dict[str, Any]]:
        """Each row's item; a row whose item is a reason is dropped, counted by that reason."""
        for row in rows:
            item = item_of(row)
            if isinstance(item, str):
                self.dropped[item] += 1
                self.truncated_dropped += bool(row.is_truncated)
                continue
            self.written += 1
            self.truncated_written += bool(row.is_truncated)
            self.models[row.model or "(not recorded)"] += 1
            yield item

    def token_item(self, row: ResultRow) -> dict[str, Any] | str:
        """A specforge-tokens row (cut at max_length, or dropped past it), or why it is dropped."""
        fitted = self._fitted(row, can_cut=True)
        if isinstance(fitted, str):
            return fitted
        return {"id": row_id(row), "input_ids": fitted.input_ids, "loss_mask": fitted.loss_mask}

    def measured(self, row: ResultRow, item: dict[str, Any] | str) -> dict[str, Any] | str:
        """A text row measured against max_length in the served tokens: written whole (the trainer cuts
        it) or dropped past it."""
        if isinstance(item, str) or self.max_length is None:
            return item
        fitted = self._fitted(row, can_cut=False)
        return (
            item if not isinstance(fitted, str) or fitted not in (PAST_MAX_LENGTH, NOTHING_LEFT) else fitted
        )

    def _fitted(self, row: ResultRow, *, can_cut: bool) -> TokenRow | str:
        """The row's tokens against max_length: as built, cut there (`can_cut`), or why it is dropped."""
        assert self.builder is not None, "a token row needs the model's tokenizer (export._builder)"
        built = self.builder.row(row)
        if isinstance(built, str):
            return built
        self.exact += built.is_exact
        self.retokenized += not built.is_exact
        limit = self.max_length
        if limit is None or len(built.input_ids) <= limit:
            return built
        self.over += 1
        self.past += sum(built.loss_mask[limit:])
        if self.over_length == "drop":
            return PAST_MAX_LENGTH
        if not any(built.loss_mask[:limit]):
            return NOTHING_LEFT
        if not can_cut:  # a text row: the trainer cuts it
            return built
        self.cut += 1
        return TokenRow(built.input_ids[:limit], built.loss_mask[:limit], built.is_exact)

    def summary(self, path: str, fmt: str) -> ExportSummary:
        notes = []
        if self.truncated_written:
            notes.append(
                f"{self.truncated_written} truncated rows written (cut at max_tokens): the text is the "
                "target model's own, and a drafter learns from every token of it; --filter no-truncated "
                "leaves them out"
            )
        if self.truncated_dropped:
            notes.append(f"{self.truncated_dropped} truncated rows dropped (counted in the reasons below)")
        if self.max_length is not None:
            notes.append(self._length_note(fmt))
        if self.retokenized:
            notes.append(
                f"{self.retokenized} rows tokenized from their text (no exact ids stored), each checked to "
                f"decode back; {self.exact} rows are the engine's own ids"
            )
        dropped = dict(self.dropped.most_common())
        reason = "; ".join(f"{n}: {why}" for why, n in dropped.items())
        return ExportSummary(
            path,
            fmt,
            self.written,
            sum(dropped.values()),
            reason,
            dropped,
            self.truncated_written,
            notes,
            max_length=self.max_length,
            over_max_length=self.over,
            cut_at_max_length=self.cut,
            loss_tokens_past_max_length=self.past,
            exact_token_rows=self.exact,
            retokenized_rows=self.retokenized,
        )

    def _length_note(self, fmt: str) -> str:
        if not self.over:
            return f"no row is longer than max_length {self.max_length}"
        done = {
            "drop": "dropped",
            "cut": "cut there" if fmt == "specforge-tokens" else "written whole (the trainer cuts them)",
        }[self.over_length]
        return (
            f"{self.over} rows longer than max_length {self.max_length}, {done}: {self.past} trained "
            "(assistant) tokens fall past it, generated and paid for but not trained on"
        )
