"""The job's shape as planning needs it: how long its prompts and outputs are, the context it needs, the KV a
request holds at its end, and how much prefix its prompts share (pure; `generate.jobshape` measures it).

Why: an engine's defaults are sized for the model's maximum context and a generic mix of requests. A job of
short distinct prompts with ~1,800-token outputs leaves most of a GPU idle under them (issue 20): planning
for the job needs these figures, measured on the job's own records where they can be.

Output lengths are a distribution requests draw from (`OutputLengths`): an earlier run's completions, or a
spec given on the command line (`LogNormalLengths.parse("mean=1800,min=300,max=6000")`).

`JobShape.counted_with` says how the tokens were counted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist

from fleetgen.errors import ConfigError

_NORMAL = NormalDist()
_Z99 = _NORMAL.inv_cdf(0.99)
# Prompt tokens estimated from text (4 bytes a token) can be twice that many: CJK text, code, a small
# vocabulary (the H200 bundle's tokenizer counts the tune prompts at 2.3 bytes a token). The context a job
# needs is a hard bound (the engine refuses a request past it) that costs little room when generous, so an
# estimated prompt is counted twice there; running requests are sized on the mean, as estimated.
ESTIMATE_CONTEXT_FACTOR = 2
SPEC_EXAMPLE = "mean=1800,min=300,max=6000 (optional: sigma=0.6)"
# Equally likely lengths kept of a distribution: the steady batch's mix is taken over them (its long tail
# weighs most: 1,024 midpoint quantiles give E[L²] within 4 % for a lognormal of sigma 2, 64 within 50 %).
SPREAD_POINTS = 1024


@dataclass(frozen=True)
class LengthStats:
    """Token lengths summarised: the mean (what KV and throughput arithmetic takes), nearest-rank
    percentiles and the maximum (what context and worst cases take). `count`: how many values it
    summarises; 0 for a distribution's exact figures or a fixed ceiling, which are no sample. `spread`: the
    lengths at `SPREAD_POINTS` evenly spaced quantiles (the values, where fewer), equally likely (what a
    steady batch's mix takes); empty where only the figures are known (the mean stands for every length)."""

    count: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    spread: tuple[int, ...] = ()

    @classmethod
    def of(cls, values: Sequence[int]) -> LengthStats:
        """The stats of `values` (at least one)."""
        if not values:
            raise ValueError("LengthStats.of needs at least one value")
        ordered = sorted(values)
        n = len(ordered)

        def rank(p: float) -> int:
            return ordered[max(math.ceil(p * n), 1) - 1]

        spread = (
            ordered if n <= SPREAD_POINTS else [ordered[i * n // SPREAD_POINTS] for i in range(SPREAD_POINTS)]
        )
        mean = math.fsum(ordered) / n
        return cls(n, mean, rank(0.5), rank(0.9), rank(0.99), ordered[-1], tuple(spread))

    @classmethod
    def fixed(cls, value: int) -> LengthStats:
        """Every figure `value`: a ceiling standing in for lengths not known (count 0)."""
        return cls(0, float(value), value, value, value, value, (value,))

    @property
    def points(self) -> tuple[float, ...]:
        """The lengths a mix of these is taken over: the spread, else the mean alone."""
        return tuple(map(float, self.spread)) or (self.mean,)


@dataclass(frozen=True)
class EmpiricalLengths:
    """Output lengths drawn from observed ones (an earlier run's completions); `source` says whose."""

    values: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.values or min(self.values) < 1:
            raise ValueError("EmpiricalLengths needs lengths of at least one token")

    def sample(self, rng: random.Random) -> int:
        return rng.choice(self.values)

    @cached_property
    def stats(self) -> LengthStats:
        return LengthStats.of(self.values)


@dataclass(frozen=True)
class LogNormalLengths:
    """A lognormal truncated to [`min`, `max`] whose mean is `mean` (the figure a user knows): its location
    `mu` is solved for that, truncation included. Refuses what cannot hold, naming the fix."""

    mean: float
    min: int
    max: int
    sigma: float
    mu: float = field(init=False)

    def __post_init__(self) -> None:
        if self.min < 1 or self.max <= self.min:
            raise _spec_error(f"need 1 ≤ min < max, got min={self.min}, max={self.max}")
        if not self.min < self.mean < self.max:
            raise _spec_error(
                f"mean={self.mean:g} must lie strictly between min={self.min} and max={self.max}"
            )
        if not 0 < self.sigma <= 10:
            raise _spec_error(f"sigma={self.sigma:g} must be in (0, 10]")
        object.__setattr__(self, "mu", self._solve_mu())
        if abs(self._truncated_mean(self.mu) - self.mean) > 0.005 * self.mean:
            raise _spec_error(
                f"mean={self.mean:g} is too close to min={self.min} or max={self.max} for "
                f"sigma={self.sigma:.2f} (lengths would pile up at that end)",
                fix=f"widen the range, or give a larger sigma= ({SPEC_EXAMPLE})",
            )

    @classmethod
    def parse(cls, spec: str) -> LogNormalLengths:
        """`mean=1800,min=300,max=6000[,sigma=0.6]` (min defaults to 1); errors name the bad part."""
        given: dict[str, float] = {}
        for part in (p.strip() for p in spec.split(",")):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("mean", "min", "max", "sigma"):
                raise _spec_error(f"{part!r} is not one of mean=, min=, max=, sigma=")
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number):
                raise _spec_error(f"{part!r}: {value.strip()!r} is not a number")
            given[key.strip()] = number
        for key in ("mean", "max"):
            if key not in given:
                raise _spec_error(f"{spec!r} has no {key}=")
        for key in ("min", "max"):
            if key in given and given[key] != int(given[key]):
                raise _spec_error(f"{key}={given[key]:g} is not a whole number of tokens")
        low, high = int(given.get("min", 1)), int(given["max"])
        sigma = given["sigma"] if "sigma" in given else default_sigma(low, high)
        return cls(given["mean"], low, high, sigma)

    @property
    def source(self) -> str:
        return f"lognormal, mean {self.mean:g} in [{self.min}, {self.max}], sigma {self.sigma:.2f}"

    def sample(self, rng: random.Random) -> int:
        return self._quantile(rng.random())

    @cached_property
    def stats(self) -> LengthStats:
        """The distribution's own figures (exact quantiles; count 0: no sample)."""
        q = self._quantile
        spread = tuple(q((i + 0.5) / SPREAD_POINTS) for i in range(SPREAD_POINTS))
        return LengthStats(0, self.mean, q(0.5), q(0.9), q(0.99), self.max, spread)

    def _bounds(self, mu: float) -> tuple[float, float]:
        return (math.log(self.min) - mu) / self.sigma, (math.log(self.max) - mu) / self.sigma

    def _quantile(self, p: float) -> int:
        """The length at probability `p` of the truncated distribution (inverse CDF), rounded, in range.
        Far out in a tail (a mean near `min` or `max`) it counts from that tail: no probability rounds to
        1."""
        a, b = self._bounds(self.mu)
        if a >= 0:  # all of [min, max] above the median: from the upper tail, Q(z) = Φ(−z)
            qa = _between(a, math.inf)
            z = -_NORMAL.inv_cdf(_open(qa - p * (qa - _between(b, math.inf))))
        else:
            pa = _between(-math.inf, a)
            z = _NORMAL.inv_cdf(_open(pa + p * (_between(-math.inf, b) - pa)))
        length = round(math.exp(self.mu + self.sigma * z))
        return min(max(length, self.min), self.max)

    def _truncated_mean(self, mu: float) -> float:
        a, b = self._bounds(mu)
        return math.exp(mu + self.sigma**2 / 2) * _between(a - self.sigma, b - self.sigma) / _between(a, b)

    def _solve_mu(self) -> float:
        """Bisection: the truncated mean rises with mu, from `min` to `max` (±25 sigma: no tail
        underflows)."""
        low, high = math.log(self.min) - 25 * self.sigma, math.log(self.max) + 25 * self.sigma
        for _ in range(200):
            middle = (low + high) / 2
            low, high = (middle, high) if self._truncated_mean(middle) < self.mean else (low, middle)
        return (low + high) / 2


OutputLengths = EmpiricalLengths | LogNormalLengths


def default_sigma(low: int, high: int) -> float:
    """The sigma that puts [low, high] at the 1st and 99th percentiles of the untruncated lognormal: a user
    who names a range says where nearly all lengths lie, not that lengths pile up at its ends."""
    return math.log(high / low) / (2 * _Z99) if high > low >= 1 else 1.0


def _between(a: float, b: float) -> float:
    """P(a < Z < b) for a standard normal Z, from the tail nearer to it (no cancellation far out)."""
    tail = math.sqrt(2)
    if a >= 0:
        return 0.5 * (math.erfc(a / tail) - math.erfc(b / tail))
    return 0.5 * (math.erfc(-b / tail) - math.erfc(-a / tail))


def _open(p: float) -> float:
    """`p` kept inside (0, 1), where the inverse normal CDF is defined."""
    return min(max(p, 1e-300), 1 - 1e-16)


def _spec_error(problem: str, fix: str = f"give them as {SPEC_EXAMPLE}") -> ConfigError:
    return ConfigError(f"output lengths: {problem}", fix=fix)


def expected_output(lengths: OutputLengths | None, max_tokens: int) -> tuple[LengthStats, str]:
    """What a request is expected to write, and where that figure comes from: the distribution's stats, else
    `max_tokens` as the ceiling. A distribution reaching past `max_tokens` is refused: those requests
    would stop there, truncated, which a plan must not assume silently."""
    if lengths is None:
        return LengthStats.fixed(
            max_tokens
        ), f"max_tokens {max_tokens}: the ceiling (no output lengths given)"
    stats = lengths.stats
    if stats.max > max_tokens:
        raise ConfigError(
            f"output lengths ({lengths.source}) reach {stats.max} tokens, past the job's max_tokens "
            f"{max_tokens}: those requests would stop there, truncated",
            fix=f"raise max_tokens in the job file to at least {stats.max}, or give lengths up to "
            f"{max_tokens}",
        )
    return stats, lengths.source


@dataclass(frozen=True)
class JobShape:
    """What the job asks of a server, measured on a sample of its records (`generate.jobshape`).

    Prompt figures are per request as `run` sends it: a multi-turn record makes one request per user turn,
    each with the turns before it (the model's earlier answers, unknown until written, are not counted in
    the prompt; `context_tokens` adds room for them)."""

    prompt_tokens: LengthStats
    output_tokens: LengthStats  # expected output per request (`output_from` says whence)
    output_from: str
    is_output_ceiling: bool  # output_tokens is max_tokens standing in for lengths not given
    max_tokens: int
    samples: int  # completions per record: each prompt is sent this many times
    thinking: bool
    # Prompt tokens per request that a prefix cache holding every other sampled prompt would find already
    # computed (system prompts, multi-turn history): the prompts' total minus their prefix tree's size,
    # per request. A record's repeated samples come on top: samples − 1 of every `samples` sends of a
    # prompt find all of it cached.
    shared_prefix_tokens: float
    counted_with: str  # "the model's tokenizer (<path>) …" or "estimate: …"
    is_estimate: bool  # prompt tokens were estimated from text, not counted with the model's tokenizer
    records_sampled: int
    records_read: int  # the whole input was read to sample it, and for its longest records
    records_bad: int  # records `run` would refuse (missing fields…), skipped here
    longest_prompt_tokens: int  # over the whole input: its longest records by text, counted alike
    max_turns: int  # requests the longest conversation in the sample makes
    max_length: int | None = None  # the trainer's sequence length (the job file's), if it says one

    @property
    def context_tokens(self) -> int:
        """The context the job needs (not the model's maximum): the longest prompt, plus `max_tokens` for
        each request a conversation makes (its answer, then that answer in the next turn's history). An
        estimated prompt counts `ESTIMATE_CONTEXT_FACTOR` times: a request past the context is refused."""
        longest = max(self.longest_prompt_tokens, self.prompt_tokens.max)
        if self.is_estimate:
            longest *= ESTIMATE_CONTEXT_FACTOR
        return longest + self.max_turns * self.max_tokens

    @property
    def kv_tokens_per_request(self) -> float:
        """The KV a request holds at its end on average (mean prompt + mean expected output): what a
        request needs to finish without being preempted, where the context size only bounds the longest
        one."""
        return self.prompt_tokens.mean + self.output_tokens.mean

    @property
    def live_kv_tokens(self) -> float:
        """The KV a request of a steady batch holds on average: requests are caught part-way through, and a
        long one is in the batch for longer (the mean prompt + E[L²] / 2 E[L] over the output lengths).
        Below `kv_tokens_per_request`: an engine that allocates as requests grow runs this many more."""
        lengths = self.output_tokens.points
        return self.prompt_tokens.mean + math.fsum(n * n for n in lengths) / (2 * math.fsum(lengths))

    def live_pages(self, page: int) -> float:
        """The `page`-token pages (⌈tokens / page⌉) a request of a steady batch fills on average: as
        `live_kv_tokens`, each output length weighted by how long it runs and its written part uniform over
        it, the pages of a request that holds t tokens counted at every t it passes through."""
        start = self.prompt_tokens.mean
        lengths = self.output_tokens.points
        held = math.fsum(_pages_passed(start + n, page) - _pages_passed(start, page) for n in lengths)
        return held / math.fsum(lengths)

    @property
    def prefix_share(self) -> float:
        """The share of prompt tokens a prefix (radix) cache could reuse: near 0, the cache only costs
        memory and running slots (SGLang's Mamba pool) and turning it off is the throughput setting."""
        return self.shared_prefix_tokens / self.prompt_tokens.mean if self.prompt_tokens.mean else 0.0


def _pages_passed(tokens: float, page: int) -> float:
    """∫₀^tokens ⌈t / page⌉ dt: the pages held, summed over the tokens a request grows through."""
    full = math.floor(tokens / page)
    return page * full * (full + 1) / 2 + (full + 1) * (tokens - full * page)
