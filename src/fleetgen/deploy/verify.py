"""Verify a running instance: process, the engine's own view, a real request, speculative decoding, capacity.

Nothing is taken on trust: argv and environ come from /proc and must equal what was rendered ("drift"
otherwise); the engine's /server_info must show the intended speculative settings, Mamba strategy, memory
fraction and concurrency; one chat completion must succeed. Speculative decoding is proven by what the engine
exposes right after that request (its verify-step counter moving: `sglang:spec_verify_calls_total`,
`vllm:spec_decode_num_drafts_total`), not by an average it fills in later; a counter that exists and did not
move refuses the server, acceptance near zero is a warning naming the likely causes. Capacity is reported
planned vs actual (what the engine reads from its start-up log, info JSON and /metrics: `Engine.capacity`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgen.deploy.script import Command
from fleetgen.engines.base import Engine
from fleetgen.errors import VerifyError
from fleetgen.http.client import EngineClient
from fleetgen.http.metrics import accept_length, counter_deltas
from fleetgen.http.request import probe_body
from fleetgen.redact import REDACTED
from fleetgen.remote.base import ProcInfo

SPEC_FLAGS = ("speculative-algorithm", "speculative-config")
# A repetitive prompt: n-gram / EAGLE drafts get accepted on it, so a speculative step is observable.
PROBE_MAX_TOKENS = 24


@dataclass(frozen=True)
class CapacityRow:
    """One capacity figure, planned next to what the engine reports."""

    what: str
    planned: float | None
    actual: float | None


@dataclass
class Verified:
    """Everything verification established about one instance."""

    model: str = ""
    accept_length: float | None = None  # None right after start: SGLang reports it after "Decode batch" lines
    spec_steps: float | None = None  # speculative verify steps during the test request (the proof it runs)
    capacity: list[CapacityRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# Fewer accepted draft tokens per verify step than this after the test request: speculation accepts nothing.
NEAR_ZERO_ACCEPTED_PER_STEP = 0.05


@dataclass(frozen=True)
class SpecEvidence:
    """What the engine exposes about speculation over the test request."""

    steps: float | None  # verify steps during the request; None: the engine has no such counter
    accept_length: float | None  # mean tokens per step (bonus included); None: not reported (yet)


def spec_evidence(
    engine: Engine,
    before: Mapping[str, float],
    after: Mapping[str, float],
    info: Any,
    generated_tokens: int | None = None,
) -> SpecEvidence:
    """Speculation over the test request: counters as differences (`before` → `after`), gauges as read.

    An engine that reports its accept length only later (SGLang fills it in after its "Decode batch" log
    lines) still shows it over the test request alone: the tokens decoded after the first one, divided by
    the verify steps that produced them (each step yields 1 + the drafts it accepted)."""
    during = counter_deltas(before, after)
    steps = during.get(engine.metrics.spec_steps_total) if engine.metrics.spec_steps_total else None
    reported = accept_length(engine, after, before, info)
    if reported is None and steps and generated_tokens and generated_tokens > 1:
        reported = (generated_tokens - 1) / steps
    return SpecEvidence(steps=steps, accept_length=reported)


def judge_spec(instance: str, ev: SpecEvidence) -> tuple[str | None, str | None]:
    """(error, warning): refuse only when the step counter exists and did not move; warn on ~0 acceptance."""
    if ev.steps is not None and ev.steps <= 0 and ev.accept_length is None:
        error = (
            f"{instance}: speculative decoding is configured but no speculative step happened during the "
            "test request (the engine's verify-step counter did not move)"
        )
        return error, None
    if ev.steps is None and ev.accept_length is None:
        return None, (
            f"{instance}: speculative decoding could not be confirmed: this engine exposes no verify-step "
            "counter and no accept length yet"
        )
    if ev.accept_length is not None and ev.accept_length - 1.0 < NEAR_ZERO_ACCEPTED_PER_STEP:
        return None, (
            f"{instance}: speculative decoding runs but accepts almost nothing: accept length "
            f"{ev.accept_length:.2f} ({ev.accept_length - 1.0:.3f} draft tokens accepted per step) after the "
            "test request. Likely: the draft weights are missing or do not match the target (an MTP head "
            "absent from the checkpoint, a draft model made for another model); with --load-format dummy "
            "(random weights) this is expected. Until fixed, speculation only costs time"
        )
    return None, None


def process_drift(command: Command, proc: ProcInfo, secret_value: str | None) -> list[str]:
    """Differences between the rendered argv/env and the running process's; empty when none. Inherited
    variables are not ours; the key reads as REDACTED where it equals `secret_value` (an old launch may have
    had it on its argv) and, in the environ, as `<different key>` where not: a rotated key shows up as drift
    without ever being printed."""
    drift: list[str] = []
    key = secret_value if command.secret else None
    running_argv = tuple(part.replace(key, REDACTED) for part in proc.argv) if key else tuple(proc.argv)
    if running_argv != command.argv:
        diff = difflib.ndiff(list(command.argv), list(running_argv))
        drift.append("argv differs (- rendered, + running): " + " ".join(d for d in diff if d[:1] in "+-"))
    for name, want in sorted(command.environ.items()):
        got = proc.environ.get(name)
        if got is not None and command.secret and name == command.secret.name:
            got = REDACTED if got == secret_value else "<different key>"
        if got is None:
            drift.append(f"env {name}: rendered {want!r}, missing in the running process")
        elif got != want:
            drift.append(f"env {name}: rendered {want!r}, running {got!r}")
    return drift


def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value after the last `--name` in args (or `--name=value`)."""
    value: str | None = None
    for i, part in enumerate(args):
        for name in names:
            if part == f"--{name}" and i + 1 < len(args):
                value = args[i + 1]
            elif part.startswith(f"--{name}="):
                value = part.split("=", 1)[1]
    return value


def view_mismatches(args: Sequence[str], info: Any, engine: Engine) -> list[str]:
    """Flags set in `args` whose effect the engine's own view does not show (its `view_checks` over an info
    JSON with one of its `view_keys`: SGLang's /server_info); empty when all match or it shows no view."""
    problems: list[str] = []
    if not (isinstance(info, dict) and any(key in info for key in engine.view_keys)):
        return problems
    aliases = dict(engine.view_aliases)
    for flags in engine.view_checks:
        want = flag_value(args, flags)
        if want is None:
            continue
        keys = [flag.replace("-", "_") for flag in flags]
        key = next((k for k in keys if k in info), None)
        got = info.get(key) if key else None
        if not _same(want, got, aliases):
            problems.append(f"--{flags[0]} {want}: the server reports {keys[0]} = {got!r}")
    return problems


def _same(want: str, got: Any, aliases: Mapping[str, str]) -> bool:
    if got is None:
        return False
    want = aliases.get(want.upper(), want) if isinstance(got, str) else want
    if isinstance(got, bool | str):
        return str(got).lower() == want.lower()
    try:
        return abs(float(got) - float(want)) < 1e-9
    except (TypeError, ValueError):
        return False


async def verify_engine(
    command: Command,
    engine: Engine,
    client: EngineClient,
    *,
    log_lines: Sequence[str],
    planned: Mapping[str, float],
) -> Verified:
    """The engine's own view, one real chat request, the accept length (when speculative), capacity."""
    out = Verified(model=await client.served_model())
    view = await client.info(engine.info_paths)
    if problems := view_mismatches(command.args, view, engine):
        raise VerifyError(
            f"{command.instance}: the engine does not run what was asked",
            fix="the engine overrode or ignored these flags; read its log for the reason "
            f"(`fleetgen logs {command.instance}`) and adjust engine.args",
            context={"mismatches": "\n".join(problems), "url": client.base_url},
        )
    before = await client.metrics(engine.metrics_path)
    reply = await client.chat(probe_body(out.model, PROBE_MAX_TOKENS))
    after = await client.metrics(engine.metrics_path)
    if flag_value(command.args, SPEC_FLAGS) is not None:
        info = await client.info(engine.info_paths)  # SGLang's averages, as they are after the request
        evidence = spec_evidence(engine, before.samples, after.samples, info, reply.completion_tokens)
        error, warning = judge_spec(command.instance, evidence)
        if error:  # speculation never stepped; accepting nothing is only a warning
            raise VerifyError(
                error,
                fix="check the speculative flags and the draft model in the log; the server runs without it "
                "(slower than planned)",
                context={"url": client.base_url},
            )
        out.warnings += [warning] if warning else []
        out.spec_steps, out.accept_length = evidence.steps, evidence.accept_length
    actual = engine.capacity(log_lines, view, after.labels)
    out.capacity = [CapacityRow(w, planned.get(w), actual.get(w)) for w in sorted({*planned, *actual})]
    return out
