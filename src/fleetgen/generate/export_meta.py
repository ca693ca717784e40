"""The sidecar every export writes beside its file (`<file>.meta.json`): what the rows are, so a trainer can
check what it trains on against what it will serve — the model and the engine (kind, release, args) that
wrote them, the chat template (sha256, where it was read) and thinking mode, the sampling, the input's
identity, the export's own options, and its counts by reason (written, dropped, truncated, over and cut at
max_length, exact vs retokenized). Written whole or not at all (`write_atomic`), after the file.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import orjson

from fleetgen.atomic import write_atomic
from fleetgen.generate.export_tokens import TokenBuilder
from fleetgen.generate.ledger import jobmeta
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.modelfiles import recorded_template

SIDECAR_SUFFIX = ".meta.json"


def sidecar_path(exported: Path) -> Path:
    return exported.with_name(exported.name + SIDECAR_SUFFIX)


def sidecar(
    store: Store,
    summary: dict[str, Any],
    models: Counter[str],
    filters: Sequence[str],
    inline_think: bool,
    builder: TokenBuilder | None,
) -> dict[str, Any]:
    """The sidecar's content for one export of `store` (`summary`: the export's summary as a dict)."""
    fleet = _meta(store, "fleet") or {}
    params = _meta(store, "params") or {}
    counts = {k: v for k, v in summary.items() if k not in ("path", "format", "notes", "skipped_reason")}
    return {
        "file": Path(summary["path"]).name,
        "format": summary["format"],
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fleetgen": _fleetgen_version(),
        "store": str(store.path),
        "model": dict(models.most_common()),
        "engine": {
            "kind": fleet.get("kind"),
            "release": fleet.get("version"),
            "model": fleet.get("model"),
            "args": _meta(store, "engine_args"),
            "endpoints": fleet.get("endpoints"),
        },
        "chat_template": {
            "recorded": recorded_template(store),
            "used": None if builder is None else _used(builder),
        },
        "thinking": params.get("thinking"),
        "sampling": params,
        "input": {
            "path": store.get_meta("input"),
            "identity": _meta(store, jobmeta.INPUT_IDENTITY),
            "earlier": _meta(store, jobmeta.EARLIER_INPUTS) or [],
        },
        "options": {"filters": list(filters), "inline_think": inline_think},
        "counts": counts,
        "notes": summary["notes"],
    }


def write_sidecar(exported: Path, content: dict[str, Any]) -> None:
    write_atomic(sidecar_path(exported), orjson.dumps(content, option=orjson.OPT_INDENT_2).decode() + "\n")


def _used(builder: TokenBuilder) -> dict[str, Any]:
    """The template and tokenizer the export built its tokens with, and the markers of its loss mask."""
    markers = builder.markers
    return {
        "sha256": builder.template.sha256,
        "source": builder.template.source,
        "tokenizer_sha256": builder.tokens.sha256,
        "thinking": builder.thinking,
        "assistant_header": markers.assistant_header,
        "end_of_turn": markers.end_of_turn,
    }


def _meta(store: Store, key: str) -> Any:
    raw = store.get_meta(key)
    return orjson.loads(raw) if raw else None


def _fleetgen_version() -> str | None:
    try:
        return version("fleetgen")
    except PackageNotFoundError:
        return None
