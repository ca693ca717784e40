"""Values the plan takes and returns: host facts in, per-instance plans out. Byte counts are ints.

`Memory` holds the figures every engine has; the engine's own `MemoryExtras` its figures, its plan-table
rows and what `up` compares. `Fix` is a candidate change, then what it yields. `Planner` is an engine's
planning (its `Engine`, with `HostRam`: the host RAM its instances pin, its reserve, its refusal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Self

from fleetgen.engines import Engine, RuleSet
from fleetgen.modelcard import ModelShape
from fleetgen.plan.job import JobShape

GIB = 1 << 30
MIB = 1 << 20
# The rule of an engine's warning that its own sizing is a chat's: `plan --job` drops it (`plan.fleet`), the
# job's own warning says what that sizing costs the job.
JOB_UNPLANNED = "job-unplanned"


@dataclass(frozen=True)
class Issue:
    """A rule that fails (error) or a caveat (warning): which rule, the engine's own words, and the fix."""

    rule: str
    message: str
    fix: str = ""


@dataclass(frozen=True)
class Fix:
    """A change to an instance: cost rank (0 = free), text, flags, env, tp (0: unchanged), and what it yields
    once sized (0: a candidate, not sized yet)."""

    cost: int
    change: str
    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    tp: int = 0
    max_running_requests: int = 0
    kv_tokens: int = 0


@dataclass(frozen=True)
class Setting:
    """One way to serve a job on one instance (`Planner.settings`): the whole `engine.args` and `engine.env`
    it launches with (the user's, with `change` over them) and what the plan says it yields for this job."""

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


@dataclass(frozen=True)
class JobPlan:
    """One instance planned for a job: the user's flags (`settings[0]`, "as-written") and the engine's
    throughput settings after them, best first; the warning when the user's leave the GPU idle."""

    settings: tuple[Setting, ...]
    warning: Issue | None = None

    @property
    def as_written(self) -> Setting:
        return self.settings[0]

    @property
    def best(self) -> Setting:
        """The setting planned to run the most of the job's requests without changing the numbers."""
        return max((s for s in self.settings if not s.numerics), key=lambda s: s.running)


@dataclass(frozen=True)
class GpuFacts:
    """One GPU: index, total and free bytes; `measured` is False when they come from the fleet file."""

    index: int
    total_bytes: int
    free_bytes: int
    measured: bool = False


@dataclass(frozen=True)
class HostFacts:
    """What planning knows of one host. `gpus` None = unknown (offline and not in the file)."""

    name: str
    gpus: tuple[GpuFacts, ...] | None = None
    mem_available_bytes: int | None = None
    engine_version: str | None = None


@dataclass(frozen=True)
class MemoryExtras:
    """The figures one engine's arithmetic adds to `Memory`'s common ones: an engine subclasses it in its own
    plan module (`SGLangExtras`, `VLLMExtras`) and names its own rows, so no engine adds a field here. This
    base has none: the extras of a plan that sized nothing (no GPU known)."""

    @classmethod
    def of(cls, memory: Memory) -> Self:
        """`memory`'s extras as this engine's, or its zero figures where the plan sized nothing (an engine
        reads only its own plans: another engine's extras are a bug)."""
        if isinstance(memory.extras, cls):
            return memory.extras
        assert type(memory.extras) is MemoryExtras, f"{type(memory.extras).__name__} read as {cls.__name__}"
        return cls()

    def budget_setting(self) -> str:
        """The engine's own setting that sized the static budget, as a flag and its value (for messages)."""
        return ""

    def memory_rows(self) -> tuple[tuple[str, int], ...]:
        """Its own byte counts per GPU, each with its label in the plan table."""
        return ()

    def capacity_rows(self) -> tuple[tuple[str, str], ...]:
        """Its own settings and capacity figures, each with its label in the plan table (label, value)."""
        return ()

    def planned(self) -> dict[str, float]:
        """Its figures that `up` sets beside what the engine reports (named as its `Engine.capacity` names
        them)."""
        return {}

    def without_pools(self) -> Self:
        """The figures when the weights leave nothing for the pools: every pool zero."""
        return self


@dataclass(frozen=True)
class Memory:
    """The engine's memory arithmetic for one instance (per GPU of it): the figures every engine has, and its
    own in `extras`."""

    free_bytes: int = 0
    budget_bytes: int = 0  # the engine's static budget (weights + its pools)
    weights_bytes: int = 0
    rest_bytes: int = 0  # what the budget leaves after the weights
    kv_bytes_per_token: int = 0
    state_bytes_per_request: int = 0  # recurrent (Mamba/GDN) state of one request
    kv_pool_bytes: int = 0
    kv_tokens: int = 0
    max_running_requests: int = 0
    headroom_bytes: int = 0  # outside the budget: activations, CUDA graphs
    headroom_needed_bytes: int = 0
    context_length: int = 0
    extras: MemoryExtras = field(default_factory=MemoryExtras)

    def without_pools(self) -> Memory:
        """These figures when the weights leave nothing for the pools: every pool zero, never negative."""
        zero = dict.fromkeys(("rest_bytes", "kv_pool_bytes", "kv_tokens", "max_running_requests"), 0)
        return replace(self, **zero, extras=self.extras.without_pools())


@dataclass(frozen=True)
class InstancePlan:
    """The plan of one instance: numbers, verdict, issues, fixes and the exact argv + env it launches."""

    instance: str
    host: str
    gpus: tuple[int, ...]
    port: int
    engine: str
    rules: str
    memory: Memory
    argv: tuple[str, ...]
    env: Mapping[str, str]
    errors: tuple[Issue, ...] = ()
    warnings: tuple[Issue, ...] = ()
    fixes: tuple[Fix, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)
    job: JobPlan | None = None  # planned for a job (`plan --job`): its running requests and settings

    @property
    def fits(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        """Every field (issues and fixes as objects; the engine's extras nested in `memory`), the main
        numbers of `memory` and the engine's extras beside them, and fits."""
        out = asdict(self)
        mem = out["memory"]
        main = ("weights_bytes", "kv_bytes_per_token", "state_bytes_per_request", "kv_tokens")
        return {
            **out,
            **{k: mem[k] for k in (*main, "max_running_requests")},
            **mem["extras"],
            "fits": self.fits,
            "fits_full_context": mem["kv_tokens"] >= mem["context_length"] > 0,
        }


@dataclass(frozen=True)
class FleetPlan:
    """Every instance's plan plus fleet-wide issues (port clashes, shared GPUs, host RAM)."""

    instances: tuple[InstancePlan, ...]
    errors: tuple[Issue, ...] = ()
    warnings: tuple[Issue, ...] = ()
    target: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.errors and all(i.fits for i in self.instances)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "instances": [i.to_json() for i in self.instances], "fits": self.fits}


@dataclass(frozen=True)
class Ask:
    """What to size: the flags (as the user wrote them), env, TP, the GPU and the rule set."""

    args: Mapping[str, Any]
    env: Mapping[str, str]
    tp: int
    free_bytes: int
    total_bytes: int
    rules: RuleSet
    shape: ModelShape


@dataclass(frozen=True)
class Sizing:
    """An engine's verdict on one set of flags: numbers, errors, warnings, resolved settings."""

    memory: Memory
    errors: tuple[Issue, ...] = ()
    warnings: tuple[Issue, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class HostRam:
    """Host RAM an engine's instances pin, summed per machine against what it has minus the engine's reserve;
    over it, the engine's refusal (its message formatted with `req` and `avail` in GB)."""

    pinned: Callable[[Memory], int]  # what one instance pins, from its plan's numbers
    reserve_bytes: int
    refusal: Issue


@dataclass(frozen=True)
class Planner:
    """One engine's plan arithmetic, registered by its engine's name in `fleetgen.plan.planners`; looked up
    once where a command starts planning and passed in from there."""

    engine: Engine  # the engine it plans (its flags: context, max running)
    size: Callable[[Ask], Sizing]  # the engine's own sizing of one instance
    # the engine's own cheaper ways out (pool size, state precision); context, more GPUs and FP8 are shared
    variants: Callable[[Ask], list[Fix]]
    # the flags that size the pools for n running requests, given a probe sizing
    concurrency: Callable[[Ask, Sizing, int], dict[str, Any]]
    # the engine's own refusals of these flags at start (its rules, certain; no memory estimate), which
    # `size` reports among its errors; `up` refuses to launch on them. They read no GPU figure.
    rejections: Callable[[Ask], tuple[Issue, ...]] = lambda _ask: ()
    # the cost-0 change one of `size`'s errors names, made before any other way out (none by default)
    required: Callable[[Ask, Sizing], Fix] = lambda _ask, _sized: Fix(0, "")
    host_ram: HostRam | None = None  # host RAM its instances pin (none by default)
    # the engine's own throughput settings for a job (`plan.throughput`): none by default, and then the
    # user's flags are the only setting
    settings: Callable[[Ask, JobShape], list[Setting]] = lambda _ask, _job: []
    # the job's running requests on a sizing and what bounds them (default: the KV pool and the engine's cap)
    bound: Callable[[Ask, Sizing, JobShape], tuple[int, str]] | None = None
