"""SGLang 0.5.17+'s tokenizer reserves a CUDA-IPC pool for multimodal features on the base GPU before the
scheduler measures its free memory (tests/data/real-engines/sglang-0.5.17-h100-tune/: 1,024 MiB and that
process's context, 1,547 MiB less free than 0.5.15 on the same card). Where the transport resolves to
cuda_ipc, the plan's free memory is smaller by exactly that; where it does not (cpu given, the legacy env
off, several nodes, encoder-only, a release before 0.5.17, a text-only model), by nothing."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgen.plan.sglang.memory import TOKENIZER_CONTEXT_BYTES
from tests.fixtures.planmodels import plan_one

MIB = 1 << 20
AT = {"mem-fraction-static": 0.85}


def _free(args: dict[str, Any], env: dict[str, str] | None = None, version: str = "0.5.17", **kw: Any) -> int:
    return plan_one({**AT, **args}, env=env, version=version, **kw).memory.free_bytes


@pytest.mark.parametrize(
    ("args", "env", "pool_mib"),
    [
        ({}, None, 1024),  # auto on one CUDA node
        ({"mm-feature-transport": "cuda_ipc"}, None, 1024),
        ({}, {"SGLANG_MM_FEATURE_CACHE_MB": "256"}, 256),
        ({}, {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1", "SGLANG_MM_FEATURE_CACHE_MB": "2048"}, 2048),
        ({"mm-feature-transport": "cpu"}, None, 0),
        ({}, {"SGLANG_USE_CUDA_IPC_TRANSPORT": "0"}, 0),
        ({"mm-feature-transport": "cpu"}, {"SGLANG_USE_CUDA_IPC_TRANSPORT": "1"}, 0),  # the flag wins
        ({"nnodes": 2}, None, 0),
        ({"encoder-only": True}, None, 0),
        ({"disaggregation-mode": "prefill"}, None, 0),
    ],
)
def test_the_pool_is_held_exactly_where_the_transport_resolves_to_cuda_ipc(
    args: dict[str, Any], env: dict[str, str] | None, pool_mib: int
) -> None:
    opted_out = _free({"mm-feature-transport": "cpu"})
    held = pool_mib * MIB + TOKENIZER_CONTEXT_BYTES if pool_mib else 0
    assert opted_out - _free(args, env) == held


def test_each_tokenizer_worker_holds_its_own_context_not_another_pool() -> None:
    one, four = _free({}), _free({"tokenizer-worker-num": 4})
    assert one - four == 3 * TOKENIZER_CONTEXT_BYTES


@pytest.mark.parametrize(("version", "model"), [("0.5.15", "qwen3.6-27b"), ("0.5.17", "qwen3-next-80b-a3b")])
def test_no_pool_before_0_5_17_or_for_a_text_only_model(version: str, model: str) -> None:
    assert _free({}, version=version, model=model) == _free(
        {"mm-feature-transport": "cpu"} if version >= "0.5.17" else {}, version=version, model=model
    )
