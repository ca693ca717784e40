"""A model folder's `config.json` (+ `model.safetensors.index.json`) read into a `ModelShape`.

Only what GPU-memory planning needs: layer layout (full attention vs Gated-DeltaNet linear attention),
KV heads and head dims, the GDN state dims, MTP layers, context length, dtype and weight bytes. Architectures
are known by name (a registry of readers); an unknown one is an error naming what is missing, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetgen.errors import ModelCardError

DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


@dataclass(frozen=True)
class ModelShape:
    """What planning needs to know about a model. Layer ids are 0-based indices into the decoder stack."""

    architecture: str
    num_layers: int
    full_attention_layer_ids: tuple[int, ...]
    linear_layer_ids: tuple[int, ...]
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    context_length: int
    dtype: str
    weight_bytes: int
    hidden_size: int = 0
    intermediate_size: int = 0  # the MLP's (0: not in config.json): a prefill chunk's activations
    vocab_size: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    conv_kernel: int = 0
    ssm_dtype: str = "float32"
    mtp_layers: int = 0
    mtp_weight_bytes: int = 0
    tie_word_embeddings: bool = False
    is_multimodal: bool = False
    is_quantized: bool = False  # a `quantization_config`: the checkpoint's weights are already quantised
    vision_num_layers: int | None = None
    vision_hidden_size: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def is_hybrid(self) -> bool:
        """Has recurrent (GDN/Mamba) layers whose state lives per request, not per token."""
        return bool(self.linear_layer_ids)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def gdn_state_bytes(
        self, tp: int, key_groups: int, conv_tokens: int, conv_bytes: int, ssm_dtype: str
    ) -> int:
        """One request's state in one GDN layer on one GPU, as both engines size it: the conv window
        (`conv_tokens` of Q and K over `key_groups` heads, and V) + the SSM state; 0 without GDN layers."""
        if not self.is_hybrid:
            return 0
        conv_dim = (
            2 * key_groups * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )
        ssm = self.linear_num_value_heads // tp * self.linear_value_head_dim * self.linear_key_head_dim
        return conv_dim // tp * conv_tokens * conv_bytes + ssm * DTYPE_BYTES[ssm_dtype]


Reader = Callable[[Mapping[str, Any], "_Found"], dict[str, Any]]


@dataclass
class _Found:
    """Collects missing fields so the error names all of them at once."""

    arch: str
    missing: list[str] = field(default_factory=list)

    def get(self, cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
        if default is None:
            self.missing.append(key)
            return 0
        return default


def _attention(cfg: Mapping[str, Any], found: _Found) -> dict[str, Any]:
    heads = found.get(cfg, "num_attention_heads")
    hidden = found.get(cfg, "hidden_size")
    head_dim = found.get(cfg, "head_dim", (hidden // heads) if heads and hidden else None)
    return {
        "num_layers": found.get(cfg, "num_hidden_layers"),
        "num_kv_heads": found.get(cfg, "num_key_value_heads", heads or None),
        "head_dim": head_dim,
        "v_head_dim": found.get(cfg, "v_head_dim", head_dim) or head_dim,
        "hidden_size": hidden,
        "vocab_size": found.get(cfg, "vocab_size"),
        "context_length": found.get(cfg, "max_position_embeddings"),
    }


def _dense(cfg: Mapping[str, Any], found: _Found) -> dict[str, Any]:
    out = _attention(cfg, found)
    return {**out, "full_attention_layer_ids": tuple(range(out["num_layers"])), "linear_layer_ids": ()}


def _hybrid_gdn(cfg: Mapping[str, Any], found: _Found) -> dict[str, Any]:
    out = _attention(cfg, found)
    num_layers = out["num_layers"]
    interval = cfg.get("full_attention_interval")
    layer_types = cfg.get("layer_types")
    if interval:  # SGLang's Qwen3NextConfig.layers_block_type: (l + 1) % interval == 0 is full attention
        full = tuple(i for i in range(num_layers) if (i + 1) % int(interval) == 0)
    elif isinstance(layer_types, list) and len(layer_types) == num_layers:
        full = tuple(i for i, t in enumerate(layer_types) if t == "full_attention")
    else:
        found.missing.append("full_attention_interval or layer_types")
        full = ()
    out["full_attention_layer_ids"] = full
    out["linear_layer_ids"] = tuple(i for i in range(num_layers) if i not in full)
    for key in (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
    ):
        out[key] = found.get(cfg, key)
    out["conv_kernel"] = found.get(cfg, "linear_conv_kernel_dim")
    out["ssm_dtype"] = cfg.get("mamba_ssm_dtype") or "float32"
    return out


# Architecture name → reader. Add a family here, never an `if arch == ...` elsewhere.
READERS: dict[str, Reader] = {
    "LlamaForCausalLM": _dense,
    "MistralForCausalLM": _dense,
    "Qwen2ForCausalLM": _dense,
    "Qwen3ForCausalLM": _dense,
    "Qwen3MoeForCausalLM": _dense,
    "Qwen3NextForCausalLM": _hybrid_gdn,
    "Qwen3_5ForConditionalGeneration": _hybrid_gdn,
    "Qwen3_5MoeForConditionalGeneration": _hybrid_gdn,
}


def _reader(config: Mapping[str, Any]) -> tuple[str, Reader]:
    archs = config.get("architectures") or []
    arch = str(archs[0]) if archs else ""
    reader = READERS.get(arch)
    if reader is None:
        raise ModelCardError(
            f"unknown architecture {arch or '(none: config.json has no architectures)'}: fleetgen cannot "
            "derive the KV and state layout, so it will not guess",
            fix=f"use a known architecture ({', '.join(sorted(READERS))}), or add a reader to "
            "fleetgen.modelcard.READERS",
        )
    return arch, reader


def _dtype(text: Mapping[str, Any], config: Mapping[str, Any], found: _Found) -> str:
    dtype = str(
        text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype") or ""
    )
    if not dtype:
        found.missing.append("torch_dtype")
    elif dtype not in DTYPE_BYTES:
        raise ModelCardError(
            f"{found.arch}: unsupported dtype {dtype!r}", fix="fleetgen plans bf16/fp16/fp32/fp8 weights"
        )
    return dtype


def parse_model_shape(config: Mapping[str, Any], index: Mapping[str, Any] | None) -> ModelShape:
    """Pure: a `config.json` dict and an optional safetensors index dict → `ModelShape`."""
    arch, reader = _reader(config)
    text = config.get("text_config") or config
    found = _Found(arch)
    fields = reader(text, found)
    dtype = _dtype(text, config, found)
    weights = ((index or {}).get("metadata") or {}).get("total_size")
    if not isinstance(weights, int) or weights <= 0:
        found.missing.append("model.safetensors.index.json metadata.total_size")
        weights = 0
    if found.missing:
        raise ModelCardError(
            f"{arch}: config.json lacks fields planning needs: {', '.join(found.missing)}",
            fix="point engine.model_config at the model's own config.json and model.safetensors.index.json",
        )
    mtp_layers = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
    mtp_bytes, notes = _mtp_bytes(index, fields, dtype, weights, mtp_layers)
    vision = config.get("vision_config") or {}
    return ModelShape(
        architecture=arch,
        dtype=dtype,
        weight_bytes=weights,
        mtp_layers=mtp_layers,
        mtp_weight_bytes=mtp_bytes,
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        is_multimodal="vision_config" in config,
        is_quantized="quantization_config" in config or "quantization_config" in text,
        vision_num_layers=vision.get("num_hidden_layers"),
        vision_hidden_size=vision.get("hidden_size"),
        notes=notes,
        intermediate_size=int(text.get("intermediate_size") or 0),
        **fields,
    )


def _mtp_bytes(
    index: Mapping[str, Any] | None, fields: Mapping[str, Any], dtype: str, weights: int, mtp_layers: int
) -> tuple[int, tuple[str, ...]]:
    """MTP draft weight bytes: the index's per-tensor sizes when it has them, else an estimate (said so)."""
    if not mtp_layers:
        return 0, ()
    sizes = (index or {}).get("weight_sizes") or {}
    listed = [k for k in ((index or {}).get("weight_map") or {}) if k.startswith("mtp.")]
    if sizes and listed:
        return sum(int(sizes.get(k, 0)) for k in listed), ()
    hidden, vocab, layers = fields["hidden_size"], fields["vocab_size"], max(fields["num_layers"], 1)
    nbytes = DTYPE_BYTES[dtype]
    per_layer = max(weights - 2 * vocab * hidden * nbytes, 0) // layers
    estimate = mtp_layers * (per_layer + 2 * hidden * hidden * nbytes)  # a decoder layer + the fc joining
    note = (
        f"MTP weights estimated at {estimate / 2**30:.2f} GiB (one decoder layer + fc): no sizes in the index"
    )
    if index is not None and not listed:
        note += "; the index lists no mtp.* tensors, so the checkpoint may not ship the draft layer"
    return estimate, (note,)


def load_model_shape(folder: Path) -> ModelShape:
    """Read `folder/config.json` and (if present) `model.safetensors.index.json` into a `ModelShape`."""
    config = _read_json(folder / "config.json")
    if config is None:
        raise ModelCardError(
            f"no config.json in {folder}",
            fix="set engine.model_config to a folder holding the model's config.json",
        )
    return parse_model_shape(config, _read_json(folder / "model.safetensors.index.json"))


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when there is no such file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelCardError(f"cannot read {path}: {exc}", fix="check the file is the model's JSON") from exc
    if not isinstance(data, dict):
        raise ModelCardError(f"{path} is not a JSON object", fix="check the file is the model's JSON")
    return data
