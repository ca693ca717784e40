"""Serving a job, not the defaults: the settings that raise one instance's running requests for this job (pure).

An engine's defaults are sized for chat: SGLang's radix cache holds ρ Mamba slots per running request (ρ = 5
with extra_buffer + overlap), so a hybrid model on a 96 GB GPU runs 8 requests while most of its memory sits
idle. For a job of distinct prompts the cache buys nothing; the throughput settings size the pools for the
job's own KV per request instead. Each engine offers its own settings (`Planner.settings`, in its flags for the
release on the host); this module holds what they share: what a setting is, how many of the job's requests a
sized instance runs and what bounds them, and the warning when that bound leaves the GPU idle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgen.plan.job import JobShape
from fleetgen.plan.types import Memory

# Below this share of the static budget in use by the job's running requests, the plan says so loudly.
IDLE_SHARE = 0.5


@dataclass(frozen=True)
class Setting:
    """One way to serve a job on one instance: the whole `engine.args` and `engine.env` it launches with (the
    user's, with `change` over them) and what the plan says it yields for this job."""

    name: str  # short and stable: "as-written", "no-radix-256", "no-radix-256-replayssm", …
    change: str  # the change in the engine's own flags ("" for the user's own)
    args: Mapping[str, Any]
    env: Mapping[str, str]
    running: int  # the job's requests it runs at once (planned)
    bound: str  # what bounds them, in words
    kv_tokens: int
    is_spec: bool = False
    numerics: str = ""  # what it changes in the numbers ("" for nothing): taken only when allowed
    used_share: float = 0.0  # share of the static budget the running requests' state and KV fill
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def changes_numerics(self) -> bool:
        return bool(self.numerics)
