"""What SGLang needs beyond its static pools at a job's heaviest moment, and the largest safe static fraction
(pure).

`mem-fraction-static` sizes the pools (weights, Mamba, KV); `1 − mfs` of the free memory is all that is left
for what the engine allocates after them. At the heaviest moment of a batch job that is, per GPU:
- the decode CUDA graphs, captured up to the batch it runs (`bs=[…, 88]`: "mem usage=0.30 GB" on the H100 at
  88, 0.22 GB on the H200 at 44): a base and ~2 MiB per batch size, as SGLang's own reserve counts them;
- `--enable-linear-replayssm`'s ring buffers, allocated after the pools: (slots + 1) × 16 steps × linear
  layers × (H_v·d_v + H_k·d_k + H_v) fp32 ("GDN ReplaySSM ring buffers allocated (L=16): d=1.564GB,
  k=0.521GB, g=0.012GB" for 88 slots of Qwen3.6-27B, exactly);
- the largest prefill chunk (`chunked-prefill-size`, 8,192 on 60–160 GiB GPUs) through one layer at a full
  batch: the residual stream, the MLP's gate/up and activation, the GDN projections and its chunked kernel's
  buffers (`chunk_gated_delta_rule_fwd_h`'s `h`: one d_k × d_v state per head per 64-token chunk), and the
  logits of the batch's last tokens, times the caching allocator's slack;
- the runtime's own buffers (cuBLAS workspaces, NCCL).
Calibrated on an H100 80GB (SGLang 0.5.15, Qwen3.6-27B, the tune job; tests/data/real-engines/
sglang-0.5.15-h100-tune/): at 0.92 `no-radix-79-replayssm` ran under load (6.3 GiB outside the pools; 5.0
needed here); at 0.95 `no-radix-88-replayssm` died in the GDN chunked prefill ("Tried to allocate 202.00 MiB
… 1.38 MiB is free"; 3.9 GiB outside, 1.27 GiB left after the rings and graphs; 5.3 needed here). Between
those two the prefill's true peak is 1.3–4.1 GiB; this model puts it at 2.6.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetgen.modelcard import ModelShape
from fleetgen.plan.types import MIB

GRAPH_BASE_BYTES = 128 * MIB
GRAPH_BYTES_PER_BS = 2 * MIB  # SGLang's own reserve: cuda_graph_max_bs × 2 MB
REPLAY_RING_STEPS = 16  # "GDN ReplaySSM ring buffers allocated (L=16)"
RING_DTYPE_BYTES = 4
GDN_CHUNK = 64  # the chunked GDN kernel's chunk (`chunk_delta_h.py`: BT = 64)
LOGIT_BYTES = 8  # fp32 logits and their fp32 softmax for sampling, per vocabulary entry
RUNTIME_BYTES = 256 * MIB
ALLOCATOR_SLACK = 1.25  # PyTorch's caching allocator: blocks freed but held, rounded sizes
FRACTION_STEP = 0.01  # the static fraction is offered and refused in hundredths


@dataclass(frozen=True)
class Headroom:
    """What the engine allocates beyond its static pools at the job's heaviest moment (bytes per GPU)."""

    graphs: int
    replay_rings: int
    prefill: int
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        return self.graphs + self.replay_rings + self.prefill + self.runtime

    def text(self) -> str:
        gib = 1 << 30
        parts = [
            f"the largest prefill chunk {self.prefill / gib:.1f} GiB",
            f"decode CUDA graphs {self.graphs / gib:.1f}",
        ]
        if self.replay_rings:
            parts.append(f"replayed-SSM ring buffers {self.replay_rings / gib:.1f}")
        parts.append(f"runtime {self.runtime / gib:.2f}")
        return ", ".join(parts)


def prefill_bytes(shape: ModelShape, tp: int, chunk: int, batch: int) -> int:
    """One prefill chunk of `chunk` tokens through one layer (the peak of its forward), and the logits of the
    last token of each of up to `batch` requests in it, before the allocator's slack."""
    dt = shape.dtype_bytes
    per_token = 4 * shape.hidden_size * dt + 3 * (shape.intermediate_size // tp) * dt
    if shape.is_hybrid:
        hk, hv = shape.linear_num_key_heads // tp or 1, shape.linear_num_value_heads // tp or 1
        dk, dv = shape.linear_key_head_dim, shape.linear_value_head_dim
        per_token += (2 * hk * dk + 2 * hv * dv + 2 * hv) * dt  # the GDN projections (q, k, v, z, b, a)
        per_token += hv * (dk + 2 * dv) * dt + hv * GDN_CHUNK * 4  # w, u, v_new; the chunk's A (fp32)
        per_token += hv * dk * dv * dt // GDN_CHUNK  # h: one state per head per chunk
    logits = min(batch, chunk) * shape.vocab_size * LOGIT_BYTES // tp
    return chunk * per_token + logits


def replay_ring_bytes(shape: ModelShape, tp: int, slots: int) -> int:
    """`--enable-linear-replayssm`'s ring buffers: per Mamba slot (and the padding one), 16 steps of every
    linear layer's d (H_v·d_v), k (H_k·d_k) and g (H_v), fp32."""
    hk, hv = shape.linear_num_key_heads // tp or 1, shape.linear_num_value_heads // tp or 1
    per_step = hv * shape.linear_value_head_dim + hk * shape.linear_key_head_dim + hv
    return (slots + 1) * REPLAY_RING_STEPS * len(shape.linear_layer_ids) * per_step * RING_DTYPE_BYTES


def headroom_needed(
    shape: ModelShape, tp: int, *, chunk: int, graph_bs: int, running: int, slots: int, is_replay: bool
) -> Headroom:
    """What the engine needs outside its static pools, running `running` requests with decode graphs up to
    `graph_bs` and prefill chunks of `chunk` tokens (`slots`: its Mamba pool, for the replay rings)."""
    return Headroom(
        graphs=GRAPH_BASE_BYTES + GRAPH_BYTES_PER_BS * max(min(graph_bs, running), 1),
        replay_rings=replay_ring_bytes(shape, tp, slots) if is_replay and shape.is_hybrid else 0,
        prefill=int(ALLOCATOR_SLACK * prefill_bytes(shape, tp, chunk, running)),
    )


def largest_safe_fraction(free_bytes: int, needed_bytes: int) -> float:
    """The largest static fraction (in hundredths) that leaves `needed_bytes` of `free_bytes` outside the
    pools; 0 where nothing does."""
    if free_bytes <= 0 or needed_bytes >= free_bytes:
        return 0.0
    # in whole hundredths, by integers: a float's rounding put 1 byte needed of 93 GB at 1.00 (nothing left)
    steps = round(1 / FRACTION_STEP)
    return steps * (free_bytes - needed_bytes) // free_bytes / steps
