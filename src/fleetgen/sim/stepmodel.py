"""How long one simulated forward pass takes: a roofline over the bytes it reads, from the model's shape.

Why a roofline: decode on a GPU is memory-bound, so a step's time is what it must read divided by the
bandwidth, and that is what makes a real engine's throughput depend on its batch. One decode step reads the
weights once (shared by the whole batch), and per running request its recurrent state (read, then written
back: 2 × state bytes) and the KV cache of its current context:

    t_step = overhead + max(bytes / bandwidth, flops / (bandwidth × FLOPS_PER_BYTE))
    bytes  = weight_bytes + Σ_req (2 × state_bytes + kv_bytes_per_token × context)

so tokens/s = batch / t_step grows with the batch and saturates once the per-request bytes dominate the
weights. The compute side (2 FLOPs per weight and token, i.e. `weight_bytes` FLOPs per token for BF16
weights) binds only for prefill and for verifying many draft tokens at once.

Speculative decoding (EAGLE/MTP, topk 1) costs `num_steps` draft passes (the draft's weights and its KV
layer, one token per request each) and one verify pass of the target over `num_draft_tokens` tokens per
request, which reads each request's state once and writes `num_draft_tokens` intermediate states (SGLang's
`intermediate_ssm` scratch: D extra state copies). A step then commits the accept length per request. At
large batches the state traffic dominates and speculation loses to plain decode, as measured on an H200.

Not modelled: attention FLOPs, kernel efficiency (real engines reach ~60-70 % of this roofline on an H200),
communication under tensor parallelism. Absolute rates are upper bounds; ratios between settings are what
the simulation is for.
"""

from __future__ import annotations

import dataclasses

from fleetgen.sim.model import ModelShape

GIB = 1 << 30
FLOPS_PER_BYTE = 200.0  # the ridge point of an H100/H200-class GPU: ~989 dense BF16 TFLOP/s over ~4.8 TB/s
FORWARD_OVERHEAD_S = 0.001  # per forward pass: CUDA-graph replay, sampling, the scheduler's own turn


@dataclasses.dataclass(frozen=True)
class Roofline:
    """The bytes and FLOPs of the simulated forward passes of one GPU (its TP share of the model)."""

    bandwidth: float  # bytes per second
    weight_bytes: int
    state_bytes: int  # one request's recurrent (conv + SSM) state; 0 for a dense model
    kv_bytes_per_token: int  # the target's full-attention layers
    draft_weight_bytes: int = 0  # the MTP draft (0 without speculative decoding)
    draft_kv_bytes_per_token: int = 0
    num_spec_steps: int = 0  # draft passes per step
    num_draft_tokens: int = 0  # tokens verified per request per step (D)
    overhead_s: float = FORWARD_OVERHEAD_S

    @property
    def is_spec(self) -> bool:
        """Each step drafts and verifies."""
        return self.num_draft_tokens > 0

    def _pass(self, num_bytes: float, num_tokens: float, weight_bytes: int) -> float:
        """One forward pass: its overhead plus the slower of its memory and its compute."""
        memory = num_bytes / self.bandwidth
        compute = num_tokens * weight_bytes / (self.bandwidth * FLOPS_PER_BYTE)
        return self.overhead_s + max(memory, compute)

    def decode_seconds(self, num_reqs: int, num_context_tokens: int) -> float:
        """One decode step of `num_reqs` requests holding `num_context_tokens` of KV between them."""
        if num_reqs <= 0:
            return 0.0
        kv = self.kv_bytes_per_token * num_context_tokens
        if not self.is_spec:
            state = 2 * self.state_bytes * num_reqs
            return self._pass(self.weight_bytes + state + kv, num_reqs, self.weight_bytes)
        draft_kv = self.draft_kv_bytes_per_token * num_context_tokens
        draft = self._pass(self.draft_weight_bytes + draft_kv, num_reqs, self.draft_weight_bytes)
        state = (1 + self.num_draft_tokens) * self.state_bytes * num_reqs
        verify_tokens = num_reqs * self.num_draft_tokens
        verify = self._pass(self.weight_bytes + state + kv, verify_tokens, self.weight_bytes)
        return self.num_spec_steps * draft + verify

    def prefill_seconds(self, num_reqs: int, num_prompt_tokens: int) -> float:
        """One prefill pass over new prompts: weights once, each prompt's KV and state written; usually
        compute-bound once the prompts add up to a few hundred tokens."""
        if num_reqs <= 0:
            return 0.0
        written = self.state_bytes * num_reqs + self.kv_bytes_per_token * num_prompt_tokens
        return self._pass(self.weight_bytes + written, num_prompt_tokens, self.weight_bytes)


@dataclasses.dataclass(frozen=True)
class FixedPace:
    """`--sim-decode-tps`: every decode step takes `1 / decode_tps` whatever the batch; prefill is free.
    `decode_tps = 0` decodes instantly (a whole answer in one step)."""

    decode_tps: float

    @property
    def is_instant(self) -> bool:
        """No simulated time passes at all."""
        return self.decode_tps <= 0

    def decode_seconds(self, num_reqs: int, num_context_tokens: int) -> float:
        """The fixed step time (0 when instant)."""
        return 0.0 if self.is_instant or num_reqs <= 0 else 1.0 / self.decode_tps

    def prefill_seconds(self, num_reqs: int, num_prompt_tokens: int) -> float:
        """Free: the legacy pacing never charged prompts."""
        return 0.0


Pace = Roofline | FixedPace


def roofline_for(
    shape: ModelShape,
    *,
    bandwidth_gbs: float,
    tp_size: int,
    ssm_dtype_bytes: int,
    num_spec_steps: int,
    num_draft_tokens: int,
) -> Roofline:
    """The roofline of one GPU of a launch: its TP share of the weights, state and KV (the same per-request
    state and KV cell the memory arithmetic sizes the pools with), and the MTP draft when speculating."""
    tp = max(1, tp_size)
    conv, ssm = shape.mamba_state_bytes(tp, ssm_dtype_bytes)
    kv = shape.kv_bytes_per_token(tp)
    is_spec = num_draft_tokens > 0
    draft_kv = kv * shape.mtp_layers // max(1, shape.num_full_attention_layers) if is_spec else 0
    return Roofline(
        bandwidth=bandwidth_gbs * 1e9,
        weight_bytes=int(shape.weights_gib * GIB / tp),
        state_bytes=conv + ssm,
        kv_bytes_per_token=kv,
        draft_weight_bytes=int(shape.draft_weights_gib(tp) * GIB) if is_spec else 0,
        draft_kv_bytes_per_token=draft_kv,
        num_spec_steps=num_spec_steps if is_spec else 0,
        num_draft_tokens=num_draft_tokens,
    )


def forced_accept_length(env_value: str | None, configured: float, max_len: int) -> float:
    """The accept length the sim commits per step: `SGLANG_SIMULATE_ACC_LEN` when set above 0 (SGLang's
    forced acceptance, off when < 0 as in `spec_utils.py`), else `--sim-accept-length`; clamped to
    [1, max_len] (`sample_simulated_acc_len`: max_len = steps + 1)."""
    value = configured
    if env_value:
        forced = float(env_value)
        if forced > 0:
            value = forced
    return max(1.0, min(value, float(max(1, max_len))))
