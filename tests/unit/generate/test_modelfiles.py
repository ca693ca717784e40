"""`generate.modelfiles`: a run keeps its model folder's tokenizer files in the output folder and records the
template; a later run whose folder holds another template is refused (one job, one rendering)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgen.errors import JobError
from fleetgen.generate.ledger.store import Store
from fleetgen.generate.modelfiles import keep_model, kept_folder, recorded_template
from tests.fixtures.chatml import chatml_folder


def test_the_template_is_kept_recorded_and_a_changed_one_refused(tmp_path: Path) -> None:
    model = chatml_folder(tmp_path / "model")
    store = Store.open(tmp_path / "out")
    recorded = keep_model(store, model, thinking=False)
    store.set_meta({key: json.dumps(value) for key, value in recorded.items()})
    stored = recorded_template(store)
    assert stored is not None and stored["thinking"] is False and len(stored["sha256"]) == 64
    kept = kept_folder(tmp_path / "out")
    assert (kept / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    assert (kept / "chat_template.jinja").read_text() == json.loads(
        (model / "tokenizer_config.json").read_text()
    )["chat_template"]
    assert keep_model(store, model, thinking=False) == recorded  # the same folder again: the same record
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] += "{{- '' }}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(JobError, match="another chat template"):
        keep_model(store, model, thinking=False)
    store.close()
