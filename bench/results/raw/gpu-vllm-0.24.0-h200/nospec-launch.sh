#!/usr/bin/env bash
# fleetgen launch script for instance h200-0: rewritten by `fleetgen up`, do not edit.
set -euo pipefail
umask 077
export CUDA_VISIBLE_DEVICES=0
export HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0
export NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/root/vsite
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export VLLM_NO_USAGE_STATS=1
export VLLM_USE_FLASHINFER_SAMPLER=0
exec /opt/torch/.venv/bin/python3 -m vllm.entrypoints.cli.main serve /root/vbundle/model --load-format dummy --max-model-len 8192 --gpu-memory-utilization 0.9 --language-model-only --gdn-prefill-backend triton --reasoning-parser qwen3 --tensor-parallel-size 1 --host 127.0.0.1 --port 30000 --served-model-name qwen3.6-27b
