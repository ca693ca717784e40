"""Everything one simulated server knows, and the JSON its info endpoints return (SGLang 0.5.23 shapes)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import time
from typing import Any

from fleetgen.sim.engine import SimScheduler
from fleetgen.sim.faults import Fault
from fleetgen.sim.memory import Capacity
from fleetgen.sim.model import ModelShape
from fleetgen.sim.tokens import SimTokens

SGLANG_VERSION = "0.5.23"


@dataclasses.dataclass
class SimKnobs:
    """The `--sim-*` values."""

    decode_tps: float
    bandwidth_gbs: float
    time_scale: float
    output_tokens: int
    reasoning_fraction: float
    start_delay: float
    fail_at_start: str | None
    crash_after: int | None
    no_spec: bool
    accept_length: float
    gpu_memory_gib: float
    weights_gib: float | None
    architecture: str | None
    fault: str = "ok"
    answer_digest: bool = False


@dataclasses.dataclass
class SimState:
    """Resolved args, capacity, the scheduler, and readiness; shared by all handlers."""

    args: dict[str, Any]
    launch_command: str
    shape: ModelShape
    capacity: Capacity
    scheduler: SimScheduler
    knobs: SimKnobs
    is_ready: bool = False
    startup_time: float = 0.0
    # How many times each distinct message carrying a `status` directive has been answered with the error.
    injected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    fault: Fault = dataclasses.field(default_factory=Fault)  # the whole-server fault on (sim/faults.py)
    tokens: SimTokens | None = None  # the model folder's template and tokenizer (return_token_ids)

    @property
    def served_model_name(self) -> str:
        """The name `/v1/models` lists."""
        return str(self.args["served_model_name"])

    def _memory_usage(self) -> dict[str, Any]:
        cap = self.capacity
        return {
            "weight": round(cap.weights_gib, 3),
            "kvcache": round(cap.kv_k_gib + cap.kv_v_gib, 3),
            "startup_available": round(cap.free_after_pools_gib, 3),
            "token_capacity": cap.max_total_num_tokens,
            "token_capacity_swa": None,
            "graph": {"decode": 1.2, "prefill": 0.0},
        }

    def internal_state(self) -> dict[str, Any]:
        """One DP rank's `Scheduler.get_internal_state` (resolved args + live state)."""
        sched = self.scheduler
        state: dict[str, Any] = dict(self.args)
        state.update(
            world_size=self.args["tp_size"] * self.args["pp_size"] * self.args["dp_size"],
            startup_time=self.startup_time,
            effective_max_running_requests_per_dp=self.capacity.max_running_requests,
            last_gen_throughput=sched.counters.last_gen_throughput,
            memory_usage=self._memory_usage(),
        )
        if self.capacity.mamba_cache_size:
            state["max_mamba_cache_size"] = self.capacity.mamba_cache_size
        accept = sched.avg_spec_accept_length
        if accept is not None:
            state["avg_spec_accept_length"] = accept
        return state

    def server_info(self) -> dict[str, Any]:
        """`GET /server_info`: resolved args + launch_command + scheduler init info + internal_states."""
        cap = self.capacity
        info: dict[str, Any] = dict(self.args)
        info.update(
            launch_command=self.launch_command,
            status="ready",
            max_total_num_tokens=cap.max_total_num_tokens,
            max_req_input_len=min(self.args["context_length"] - 1, cap.max_total_num_tokens - 1),
            startup_time=self.startup_time,
            hicache_object_layout={
                "enabled": False,
                "reason": "Hierarchical cache is disabled",
                "page_size": 1,
            },
            kv_events=None,
            internal_states=[self.internal_state()],
            version=SGLANG_VERSION,
            frontend="python",
        )
        return info

    def model_info(self) -> dict[str, Any]:
        """`GET /model_info`."""
        args = self.args
        return {
            "model_path": args["model_path"],
            "served_model_name": self.served_model_name,
            "tokenizer_path": args["tokenizer_path"],
            "is_generation": True,
            "preferred_sampling_params": args["preferred_sampling_params"],
            "weight_version": args["weight_version"],
            "load_format": args["load_format"],
            "reasoning_parser": args["reasoning_parser"],
            "tool_call_parser": args["tool_call_parser"],
            "disaggregation_mode": args["disaggregation_mode"],
            "has_image_understanding": self.shape.architecture.endswith("ForConditionalGeneration"),
            "has_audio_understanding": False,
            "model_type": self.shape.model_type,
            "architectures": [self.shape.architecture],
        }

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`."""
        card = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.served_model_name,  # `http_server.py` available_models: root=served_model_name
            "parent": None,
            "max_model_len": self.args["context_length"],
        }
        return {"object": "list", "data": [card]}

    def loads(self) -> dict[str, Any]:
        """`GET /v1/loads` (0.5.23 has no `/get_load` any more)."""
        sched, cap = self.scheduler, self.capacity
        counters = sched.counters
        load: dict[str, Any] = {
            "dp_rank": 0,
            "timestamp": time.time(),
            "num_running_reqs": counters.num_running,
            "num_waiting_reqs": counters.num_queued,
            "num_used_tokens": counters.used_tokens,
            "num_total_tokens": counters.used_tokens,
            "max_total_num_tokens": cap.max_total_num_tokens,
            "max_running_requests": cap.max_running_requests,
            "token_usage": round(sched.token_usage, 4),
            "gen_throughput": round(counters.last_gen_throughput, 2),
            "cache_hit_rate": 0.0,
            "memory": {
                k: v for k, v in self._memory_usage().items() if k in ("weight", "kvcache", "token_capacity")
            },
            "queues": {"waiting": counters.num_queued, "grammar": 0, "paused": 0, "retracted": 0},
        }
        accept = sched.avg_spec_accept_length
        if accept is not None:
            load["speculative"] = {"accept_length": accept}
        return {
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": "NVIDIA H100 80GB HBM3 (simulated)",
            "num_accelerators": self.args["tp_size"] * self.args["pp_size"],
            "loads": [load],
        }
