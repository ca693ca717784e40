"""What a job keeps of its model folder: the chat template the servers apply and the tokenizer they
tokenize with, copied into the output folder (`OUT/model/`) when a run starts and recorded in the store's
meta (`chat_template`: the template's sha256 and source, the tokenizer's sha256, the thinking mode the job
runs). The token export builds its rows with exactly these (`export_tokens`), whatever the model folder
holds by then; the sidecar of every export names them.

A run whose model folder holds another template than the one the job began with is refused: the rows
would mix two renderings of one conversation (a drafter trained on them learns neither).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson

from fleetgen.atomic import write_atomic
from fleetgen.chattemplate import MODEL_FILES, TOKENIZER_FILE, ChatTemplate, ModelTokens
from fleetgen.errors import JobError
from fleetgen.generate.ledger.store import Store

KEPT_DIR = "model"  # in the output folder
META_KEY = "chat_template"
MAX_LENGTH = "max_length"  # the job file's: the training exports' default --max-length


def keep_model(store: Store, model_dir: Path, thinking: bool) -> dict[str, Any]:
    """Copy the model folder's tokenizer files into the output folder; the meta entry that records them.
    Refuses a template other than the one the job's store recorded."""
    template = ChatTemplate.read(model_dir)
    tokens = ModelTokens(model_dir / TOKENIZER_FILE)
    recorded = {
        "sha256": template.sha256,
        "source": template.source,
        "tokenizer_sha256": tokens.sha256,
        "thinking": thinking,
        "kept": KEPT_DIR,
    }
    stored = recorded_template(store)
    if stored is not None and stored.get("sha256") != template.sha256:
        raise JobError(
            f"{template.source} holds another chat template (sha256 {template.sha256[:12]}) than the one "
            f"this job began with ({str(stored.get('sha256'))[:12]}, {stored.get('source')})",
            fix="serve the model folder the job began with, or run into a new output folder",
        )
    kept = store.path.parent / KEPT_DIR
    try:
        for name in MODEL_FILES:
            if (model_dir / name).is_file() and not (kept / name).is_file():
                kept.mkdir(exist_ok=True)
                shutil.copyfile(model_dir / name, kept / f".{name}.tmp")
                (kept / f".{name}.tmp").replace(kept / name)
        if not (kept / "chat_template.jinja").is_file():  # the template's text, whatever file held it
            write_atomic(kept / "chat_template.jinja", template.text)
    except OSError as exc:
        raise JobError(
            f"cannot keep the model's tokenizer files in {kept}: {exc.strerror}",
            fix="check the output folder is writable and has space",
        ) from exc
    return {META_KEY: recorded}


def recorded_template(store: Store) -> dict[str, Any] | None:
    """The `chat_template` meta a run recorded; None for a job run without a model folder."""
    raw = store.get_meta(META_KEY)
    value = orjson.loads(raw) if raw else None
    return value if isinstance(value, dict) else None


def kept_folder(out_dir: Path) -> Path:
    return out_dir / KEPT_DIR
