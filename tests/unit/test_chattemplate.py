"""`fleetgen.chattemplate`: a model folder's template read from either file, rendered as the engines render
it, its turn markers probed (ChatML with thinking on and off, Llama 3's headers), and each token's bytes
joining to the decoded text for any text (a byte-level BPE splits characters across tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgen.chattemplate import ChatTemplate, ModelTokens, TurnMarkers
from fleetgen.errors import ModelCardError
from tests.fixtures.chatml import CHATML, chatml_folder

LLAMA3 = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


@pytest.mark.parametrize("template_file", [False, True])
def test_the_template_is_read_from_either_file_and_rendered_as_the_engines_do(
    tmp_path: Path, template_file: bool
) -> None:
    folder = chatml_folder(tmp_path / "m", template_file=template_file)
    template = ChatTemplate.read(folder)
    assert template.text == CHATML and template.source.endswith(
        "chat_template.jinja" if template_file else "tokenizer_config.json"
    )
    user = [{"role": "user", "content": "hi"}]
    opened = template.render(user, add_generation_prompt=True, thinking=True)
    assert opened == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    closed = template.render(user, add_generation_prompt=True, thinking=False)
    assert closed.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("thinking", [True, False, None])
def test_chatml_markers_are_specforges_qwen3_ones(tmp_path: Path, thinking: bool | None) -> None:
    """SpecForge's `qwen3-thinking` template: header `<|im_start|>assistant\\n`, end `<|im_end|>\\n`."""
    template = ChatTemplate.read(chatml_folder(tmp_path / "m"))
    assert template.markers(thinking) == TurnMarkers("<|im_start|>assistant\n", "<|im_end|>\n")


def test_llama3_markers(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": [{"name": "default", "template": LLAMA3}], "bos_token": "<|bot|>"})
    )
    template = ChatTemplate.read(tmp_path)
    assert template.render([], add_generation_prompt=False, thinking=None) == "<|bot|>"
    markers = template.markers(None)
    assert markers == TurnMarkers("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")


def test_a_folder_without_a_template_is_refused_naming_the_files(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelCardError, match=r"no chat_template in tokenizer_config\.json"):
        ChatTemplate.read(tmp_path)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> ModelTokens:
    return ModelTokens(chatml_folder(tmp_path_factory.mktemp("m")) / "tokenizer.json")


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=["Cs"]), max_size=60))
def test_token_bytes_join_to_the_text(tokens: ModelTokens, text: str) -> None:
    ids = tokens.encode(f"<|im_start|>user\n{text}<|im_end|>\n")
    pieces = tokens.token_bytes(ids)
    assert len(pieces) == len(ids)
    assert b"".join(pieces).decode() == tokens.decode(ids)
