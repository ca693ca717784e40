#!/usr/bin/env bash
# fleetgen launch script for instance h200-0: rewritten by `fleetgen up`, do not edit.
set -euo pipefail
umask 077
export CUDA_VISIBLE_DEVICES=0
export HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0
export NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/root/site:/root/site/nvidia_cutlass_dsl/python_packages
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
exec /opt/torch/.venv/bin/python3 -m sglang.launch_server --load-format dummy --context-length 8192 --mem-fraction-static 0.85 --reasoning-parser qwen3 --speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --mamba-radix-cache-strategy extra_buffer --attention-backend fa3 --sampling-backend pytorch --mm-attention-backend triton_attn --model-path /root/bundle/model --tp-size 1 --host 127.0.0.1 --port 30000 --served-model-name qwen3.6-27b --enable-metrics
