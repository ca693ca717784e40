"""ModelShape from the model configs in tests/data/models (written from public facts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgen.errors import ModelCardError
from fleetgen.modelcard import load_model_shape, parse_model_shape

MODELS = Path(__file__).parents[1] / "data" / "models"


def _config(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((MODELS / name / "config.json").read_text())
    return data


def test_qwen36_27b_is_a_multimodal_hybrid_with_mtp() -> None:
    shape = load_model_shape(MODELS / "qwen3.6-27b")
    assert shape.architecture == "Qwen3_5ForConditionalGeneration"
    assert shape.is_multimodal and shape.is_hybrid
    assert shape.num_layers == 64
    assert shape.full_attention_layer_ids == tuple(range(3, 64, 4))
    assert len(shape.linear_layer_ids) == 48
    assert (shape.num_kv_heads, shape.head_dim, shape.v_head_dim) == (4, 256, 256)
    assert (shape.linear_num_key_heads, shape.linear_num_value_heads) == (16, 48)
    assert shape.weight_bytes == 55_562_285_056  # the index's total_size
    assert shape.mtp_layers == 1
    assert any("estimated" in note for note in shape.notes)  # the index has no sizes: said, not hidden
    # The draft is one full-attention decoder layer plus the fc joining embedding and hidden state; counted
    # here from the config's dimensions (gated q, GQA k/v, o, a SwiGLU MLP, fc 2h × h) in bf16, it is
    # 849 MB. The estimate (an average layer of the checkpoint) must land near it.
    h, heads, kv, hd, inter = 5120, 24, 4, 256, 17408
    attention = h * (2 * heads * hd) + 2 * h * (kv * hd) + (heads * hd) * h
    draft_bytes = 2 * (attention + 3 * h * inter + 2 * h * h)
    assert 0.85 * draft_bytes <= shape.mtp_weight_bytes <= 1.15 * draft_bytes
    assert shape.context_length == 262_144 and shape.dtype == "bfloat16" and shape.ssm_dtype == "float32"


def test_llama_is_dense_gqa() -> None:
    shape = load_model_shape(MODELS / "llama-3.1-8b")
    assert not shape.is_hybrid and not shape.is_multimodal
    assert shape.full_attention_layer_ids == tuple(range(32))
    assert (shape.num_kv_heads, shape.head_dim) == (8, 128)  # head_dim derived: 4096 / 32
    assert shape.mtp_layers == 0 and shape.mtp_weight_bytes == 0


def test_qwen3_next_is_hybrid() -> None:
    shape = load_model_shape(MODELS / "qwen3-next-80b-a3b")
    assert shape.is_hybrid
    assert len(shape.full_attention_layer_ids) == 12 and len(shape.linear_layer_ids) == 36
    assert shape.weight_bytes > 150e9


def test_layer_types_used_when_no_interval() -> None:
    config = _config("qwen3.6-27b")
    text = dict(config["text_config"])  # type: ignore[call-overload]
    del text["full_attention_interval"]
    text["layer_types"] = ["full_attention"] * 2 + ["linear_attention"] * 62
    shape = parse_model_shape({**config, "text_config": text}, {"metadata": {"total_size": 1}})
    assert shape.full_attention_layer_ids == (0, 1)


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(ModelCardError, match="unknown architecture FooForCausalLM"):
        parse_model_shape({"architectures": ["FooForCausalLM"]}, None)


def test_missing_fields_are_all_named() -> None:
    config = {
        k: v for k, v in _config("llama-3.1-8b").items() if k not in ("num_key_value_heads", "hidden_size")
    }
    config["num_attention_heads"] = None
    with pytest.raises(ModelCardError) as info:
        parse_model_shape(config, None)
    message = info.value.message
    for field in ("num_attention_heads", "hidden_size", "metadata.total_size"):
        assert field in message


def test_missing_folder_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelCardError, match=r"no config\.json") as info:
        load_model_shape(tmp_path)
    assert "model_config" in info.value.fix
