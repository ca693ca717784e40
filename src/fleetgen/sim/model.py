"""The simulated model's shape: what SGLang would read from `config.json`, with Qwen3.6-27B as the default.

Only what the startup arithmetic and the HTTP surface need: architecture, attention layers, KV heads, the
Gated-DeltaNet state per request for hybrid archs, context length, and a weight size. If `--model-path` is a
folder with a `config.json` its values win; otherwise (the usual case on a laptop) the defaults stand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

# SGLang 0.5.23 `arg_groups/overrides.py::_MAMBA_RADIX_CACHE_ARCHS` (the hybrid archs fleetgen cares about).
HYBRID_ARCHS = frozenset(
    {
        "Qwen3NextForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "KimiLinearForCausalLM",
        "NemotronHForCausalLM",
        "FalconH1ForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "Lfm2ForCausalLM",
    }
)
DEFAULT_ARCH = "Qwen3_5ForConditionalGeneration"
DEFAULT_WEIGHTS_GIB = 51.0  # Qwen3.6-27B BF16 target weights (55.56 GB checkpoint incl. vision)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Numbers the simulated startup needs; all per GPU at TP=1."""

    architecture: str
    model_type: str
    num_hidden_layers: int
    num_full_attention_layers: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    context_len: int
    weights_gib: float
    eos_token_id: int
    hidden_size: int = 5120
    vocab_size: int = 248320
    tie_word_embeddings: bool = False
    mtp_layers: int = 1  # `mtp_num_hidden_layers`: the MTP head EAGLE/NEXTN loads as its draft model

    @property
    def is_hybrid(self) -> bool:
        """A Gated-DeltaNet/Mamba hybrid: SGLang keeps a per-request state pool next to the KV cache."""
        return self.architecture in HYBRID_ARCHS

    def kv_bytes_per_token(self, tp_size: int, dtype_bytes: int = 2) -> int:
        """K+V bytes per token over the full-attention layers (KV heads split over TP, at least one)."""
        heads = max(1, self.num_key_value_heads // max(1, tp_size))
        return 2 * heads * self.head_dim * dtype_bytes * self.num_full_attention_layers

    def draft_weights_gib(self, tp_size: int) -> float:
        """What loading the MTP head takes (`Qwen3_5ForCausalLMMTP`): its decoder layer(s) + fc, and its own
        embedding and LM head (shared with the target only after the load): "mem usage=5.53 GB" on a real
        H200 for Qwen3.6-27B. The layer is estimated from the target's weights."""
        if not self.mtp_layers:
            return 0.0
        tables = (1 if self.tie_word_embeddings else 2) * self.vocab_size * self.hidden_size * 2
        layer = (self.weights_gib * 2**30 - tables) / max(1, self.num_hidden_layers)
        fc = 2 * self.hidden_size * self.hidden_size * 2
        return (tables + self.mtp_layers * (layer + fc)) / max(1, tp_size) / 2**30

    def mamba_state_bytes(self, tp_size: int, ssm_dtype_bytes: int = 4) -> tuple[int, int]:
        """(conv, ssm) state bytes per request over all linear layers (bf16 conv, fp32 SSM by default)."""
        if not self.is_hybrid:
            return 0, 0
        tp = max(1, tp_size)
        num_linear = self.num_hidden_layers - self.num_full_attention_layers
        conv_dim = (
            self.linear_value_head_dim * self.linear_num_value_heads
            + 2 * self.linear_num_key_heads * self.linear_key_head_dim
        ) // tp
        conv = conv_dim * (self.linear_conv_kernel_dim - 1) * 2
        ssm = (self.linear_num_value_heads // tp) * self.linear_key_head_dim * self.linear_value_head_dim
        return conv * num_linear, ssm * ssm_dtype_bytes * num_linear


DEFAULT_SHAPE = ModelShape(
    architecture=DEFAULT_ARCH,
    model_type="qwen3_5",
    num_hidden_layers=64,
    num_full_attention_layers=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    context_len=262144,
    weights_gib=DEFAULT_WEIGHTS_GIB,
    eos_token_id=248046,
)


def _full_attention_layers(text: dict[str, Any], num_layers: int, is_hybrid: bool) -> int:
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list):
        return sum(1 for kind in layer_types if kind == "full_attention")
    interval = int(text.get("full_attention_interval", 4 if is_hybrid else 1))
    return num_layers // max(1, interval)


def _weights_gib(folder: Path) -> float | None:
    sizes = [p.stat().st_size for p in folder.glob("*.safetensors")]
    return sum(sizes) / 2**30 if sizes else None


def load_shape(model_path: str, architecture: str | None, weights_gib: float | None) -> ModelShape:
    """The shape for `--model-path`: its config.json when it is a readable folder, else the defaults."""
    folder = Path(model_path)
    config_file = folder / "config.json"
    shape = DEFAULT_SHAPE
    if config_file.is_file():
        config: dict[str, Any] = json.loads(config_file.read_text())
        text: dict[str, Any] = {**config, **config.get("text_config", {})}
        arch = (config.get("architectures") or [DEFAULT_ARCH])[0]
        num_layers = int(text.get("num_hidden_layers", shape.num_hidden_layers))
        heads = int(text.get("num_attention_heads", 8))
        eos = text.get("eos_token_id", shape.eos_token_id)
        shape = dataclasses.replace(
            shape,
            architecture=arch,
            model_type=str(config.get("model_type") or text.get("model_type", "")),  # hf_config's, not text's
            num_hidden_layers=num_layers,
            num_full_attention_layers=_full_attention_layers(text, num_layers, arch in HYBRID_ARCHS),
            num_key_value_heads=int(text.get("num_key_value_heads", heads)),
            head_dim=int(text.get("head_dim", int(text.get("hidden_size", 4096)) // heads)),
            context_len=int(text.get("max_position_embeddings", shape.context_len)),
            weights_gib=_weights_gib(folder) or shape.weights_gib,
            eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
            hidden_size=int(text.get("hidden_size", shape.hidden_size)),
            vocab_size=int(text.get("vocab_size", shape.vocab_size)),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            mtp_layers=int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0),
            **{k: int(text[k]) for k in _LINEAR_FIELDS if k in text},
        )
    if architecture is not None:
        shape = dataclasses.replace(shape, architecture=architecture)
    if weights_gib is not None:
        shape = dataclasses.replace(shape, weights_gib=weights_gib)
    return shape


_LINEAR_FIELDS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
