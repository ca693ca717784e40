"""Fleet file → one `WantedInstance` per instance: argv and env from the engine, the script, its sha256.

Pure apart from reading the API key from fleetgen's own environment (named by `engine.api_key_env`).

How the key reaches the engine: its env var, else a `--config` file (`_secret`). `refuse_simulated_acceptance`
(`up`, `restart`, `run`) refuses an engine setting that commits tokens the model did not choose, as
`Engine.simulated_acceptance` names it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

from fleetgen.config import EngineConfig, FleetFile, HostEntry, Instance
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.deploy.hostsurvey import HostSurvey
from fleetgen.deploy.script import Command, InstancePaths, SecretEnv, render_script
from fleetgen.deploy.types import WantedInstance
from fleetgen.engines import Engine, format_args, launcher_of
from fleetgen.errors import ConfigError
from fleetgen.plan import HostFacts, InstancePlan, Launch, decide_launch, facts_from_file
from fleetgen.plan.fleet import api_key_way

# An API key as an HTTP header carries it (printable ASCII, no space), long enough to guess at no cost, and
# without `<`/`>`: no key can then be formed across the `<redacted>` mark put where a key was.
KEY_FORM = re.compile(r"[\x21-\x3b=\x3f-\x7e]{16,}")


def api_key(fleet_file: FleetFile) -> str | None:
    """The API key for a public bind, from the environment variable the fleet file names; None on loopback."""
    cfg = fleet_file.engine
    if not cfg.is_public or not cfg.api_key_env:
        return None
    value = os.environ.get(cfg.api_key_env, "")
    if not value:
        raise ConfigError(
            f"engine.bind = {cfg.bind!r} needs an API key, but ${cfg.api_key_env} is empty",
            fix=f"export {cfg.api_key_env}=<key> before running fleetgen (the key reaches each engine "
            "through 0600 files removed once it started, never argv, the script or fleetgen's state)",
        )
    if not KEY_FORM.fullmatch(value):
        raise ConfigError(
            f"${cfg.api_key_env} is no usable API key: it needs 16 or more printable ASCII characters, "
            "no space, `<` or `>` (it travels in an HTTP header, and is redacted from every log line)",
            fix=f"set {cfg.api_key_env} to e.g. the output of `openssl rand -hex 24`",
        )
    return value


def refuse_simulated_acceptance(fleet: Fleet) -> None:
    """Raise ConfigError when the fleet's engine carries a setting that commits tokens the model did not
    choose (the engine says which: `Engine.simulated_acceptance` over `engine.args` and `engine.env`): its
    completions would not be the model's. `up`, `restart` and `run` call it before anything else; only a
    throughput measurement that knows it (`tune`) launches such servers."""
    cfg = fleet.file.engine
    each = (fleet.file.engine_for(h.name).args for h in fleet.file.hosts)  # a host's engine_args too
    found = tuple(
        dict.fromkeys(s for a in each for s in fleet.engine.simulated_acceptance(format_args(a), cfg.env))
    )
    if not found:
        return
    tables = sorted({"[engine.env]" if s.partition("=")[0] in cfg.env else "[engine.args]" for s in found})
    raise ConfigError(
        f"{fleet.path}: {', '.join(found)}: {fleet.engine.name} would commit tokens the model did not choose "
        "(a simulated speculative acceptance): every completion would be text the model did not write",
        fix=f"remove {'these settings' if len(found) > 1 else 'it'} from {' and '.join(tables)} of "
        f"{fleet.path}: it is for throughput measurement only (`fleetgen tune --simulate-accept-length L` "
        "sets it on its own servers, never on a fleet that generates)",
        context={"engine": fleet.engine.name},
    )


def measured_facts(host: HostEntry, measured: HostSurvey | None) -> HostFacts:
    """What `plan` knows of a host, from what `up` measured (GPUs, RAM, engine version) over the file's
    values: the same inputs `plan` gathers, so both decide the same argv (`decide_launch`)."""
    if measured is None:
        return facts_from_file(host)
    return facts_from_file(host, measured.gpus, measured.mem_available_bytes, measured.engine_version)


def build_command(
    fleet_file: FleetFile, engine: Engine, inst: Instance, workdir: str, launch: Launch | None = None
) -> Command:
    """The argv and env one instance runs with, as `decide_launch` decided them (from the fleet file alone
    when `launch` is None: nothing measured on the host)."""
    cfg = fleet_file.engine
    launch = launch or decide_launch(
        fleet_file.engine_for(inst.host), inst, facts_from_file(fleet_file.host(inst.host))
    )
    secret = _secret(cfg, engine)
    if secret is not None and secret.config_key:
        refused, _ = api_key_way(fleet_file, engine)
        if refused:
            raise ConfigError(refused[0].message, fix=refused[0].fix)
    env = dict(launch.env)
    if fleet_file.assigns_devices:  # the cluster hands the server its GPUs (and sets CUDA_VISIBLE_DEVICES)
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return Command(
        instance=inst.name,
        python=launch.python,
        launcher=launcher_of(cfg),
        args=launch.argv[1 + len(launcher_of(cfg)) :],
        env=env,
        paths=InstancePaths.of(workdir, inst.name),
        secret=secret,
    )


def _secret(cfg: EngineConfig, engine: Engine) -> SecretEnv | None:
    """How the API key reaches the engine, never on its argv: the engine's own env var when it has one
    (vLLM), else a YAML config file named on the argv (SGLang's `--config`, under its flag's name); the
    launch script holds it in `api_key_env` too, for the log redactor and for `up` to see a rotated key."""
    if not cfg.is_public or not cfg.api_key_env:
        return None
    if engine.api_key_env_var:
        return SecretEnv(engine.api_key_env_var)
    return SecretEnv(cfg.api_key_env, config_key=engine.api_key_flag.removeprefix("--"))


def wanted_command(fleet_file: FleetFile, engine: Engine, inst: Instance, measured: HostSurvey) -> Command:
    """What `build_wanted` would run, without rendering its script: what `status` compares with /proc and
    what `down` finds and stops."""
    launch = decide_launch(
        fleet_file.engine_for(inst.host), inst, measured_facts(fleet_file.host(inst.host), measured)
    )
    return build_command(fleet_file, engine, inst, measured.workdir, launch)


def build_wanted(
    fleet_file: FleetFile,
    engine: Engine,
    inst: Instance,
    measured: HostSurvey,
    secret_value: str | None,
    planned: Mapping[str, float] | None = None,
) -> WantedInstance:
    """One instance as the fleet file wants it on its host (`measured`: what this command read there)."""
    facts = measured_facts(fleet_file.host(inst.host), measured)
    launch = decide_launch(fleet_file.engine_for(inst.host), inst, facts)
    command = build_command(fleet_file, engine, inst, measured.workdir, launch)
    script = render_script(command)
    return WantedInstance(
        inst=inst,
        launch=launch,
        command=command,
        script=script,
        sha256=hashlib.sha256(script.encode()).hexdigest(),
        secret_value=secret_value,
        planned=dict(planned or {}),
        timeout_s=fleet_file.engine.ready_timeout_s,
    )


def planned_figures(plan: InstancePlan | None) -> dict[str, float]:
    """The plan's KV tokens, concurrency and the engine's own planned figures (`MemoryExtras.planned`:
    SGLang's Mamba slots) for one instance; empty without a plan (no model shape here) or when it cannot
    size it: `fleetgen plan` shows why; deploying goes on."""
    if plan is None:
        return {}
    mem = plan.memory
    figures = {"kv_tokens": float(mem.kv_tokens), "max_running_requests": float(mem.max_running_requests)}
    return {what: n for what, n in (figures | mem.extras.planned()).items() if n}
