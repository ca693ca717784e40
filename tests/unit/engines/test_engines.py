"""Engine registry, argv/env builders, rule-set selection and verdict parsing (pure)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fleetgen
from fleetgen.config import ENGINE_KINDS, ArgValue, FleetFile
from fleetgen.deploy.script import SecretEnv
from fleetgen.deploy.wanted import build_command
from fleetgen.engines import ENGINES, format_args, get_engine, select_rule_set, translate_args
from fleetgen.engines.base import VERDICT_MARK, Engine
from fleetgen.engines.rules import release
from fleetgen.engines.sglang_timeline import rules_for
from fleetgen.errors import ConfigError
from fleetgen.plan import decide_launch, facts_from_file
from fleetgen.plan.planners import PLANNERS


def _fleet(kind: str, **engine: object) -> FleetFile:
    return FleetFile.model_validate(
        {
            "engine": {"kind": kind, "model": "/models/q", **engine},
            "hosts": [{"name": "a", "gpus": [0, 1, 2, 3]}],
        }
    )


def test_format_args_booleans_lists_scalars() -> None:
    argv = format_args({"a": True, "b": False, "c": [1, 2], "d": 0.9, "e": "x"})
    assert argv == ["--a", "--c", "1", "2", "--d", "0.9", "--e", "x"]


def test_sglang_argv_and_env() -> None:
    fleet = _fleet(
        "sglang",
        tp=2,
        args={"mem-fraction-static": 0.9, "disable-radix-cache": False},
        env={"X": "1"},
        served_model_name="q",
    )
    inst = fleet.instances()[1]
    engine = get_engine("sglang")
    argv = engine.build_argv(fleet.engine, inst, rules_for("0.5.23"))
    assert argv[:2] == ["--mem-fraction-static", "0.9"]
    assert "--disable-radix-cache" not in argv
    joined = " ".join(argv)
    assert "--model-path /models/q --tp-size 2 --host 127.0.0.1 --port 30001" in joined
    assert "--served-model-name q" in joined and "--enable-metrics" in argv
    assert engine.build_env(fleet.engine, inst) == {"X": "1", "CUDA_VISIBLE_DEVICES": "2,3"}


def test_vllm_argv_has_positional_model_and_keeps_the_public_key_off_the_argv() -> None:
    fleet = _fleet("vllm", bind="0.0.0.0", api_key_env="MY_KEY", args={"max-model-len": 4096})
    inst = fleet.instances()[0]
    engine = get_engine("vllm")
    argv = engine.build_argv(fleet.engine, inst, engine.rule_sets[0])
    assert argv[0] == "/models/q"
    assert "--api-key" not in argv and not any("MY_KEY" in a for a in argv)  # `ps` shows every argv
    assert engine.api_key_env_var == "VLLM_API_KEY"  # the launch script exports the key under this name
    assert "--tensor-parallel-size" in argv


def test_sglang_gets_the_public_key_by_config_file_never_on_its_argv() -> None:
    """SGLang has no env var for its key: `--config api_key.yaml` (relative: the engine runs in its instance
    folder, so `plan` and `up` show one argv); `--api-key` never appears, and a
    user's own `config` in engine.args is refused (SGLang takes one config file) with the way out."""
    fleet = _fleet("sglang", bind="0.0.0.0", api_key_env="MY_KEY", args={})
    engine = get_engine("sglang")
    s = build_command(fleet, engine, fleet.instances()[0], "/w")
    assert s.args[-2:] == ("--config", "api_key.yaml") and "--api-key" not in s.args
    assert engine.api_key_env_var is None and s.secret == SecretEnv("MY_KEY", config_key="api-key")
    assert s.secret_files("k" * 16)["/w/a-0/api_key.yaml"] == b'api-key: "kkkkkkkkkkkkkkkk"\n'
    own = _fleet("sglang", bind="0.0.0.0", api_key_env="MY_KEY", args={"config": "/mine.yaml"})
    with pytest.raises(ConfigError) as err:
        build_command(own, engine, own.instances()[0], "/w")
    assert "--config" in err.value.message and "engine.args" in err.value.fix
    loopback = _fleet("sglang", args={"config": "/mine.yaml"})
    assert "--config" in build_command(loopback, engine, loopback.instances()[0], "/w").args


def test_renamed_flags_are_translated_per_era() -> None:
    args: dict[str, ArgValue | list[ArgValue]] = {
        "mamba-scheduler-strategy": "extra_buffer",
        "cuda-graph-max-bs": 32,
    }
    new = translate_args(args, rules_for("0.5.23"))
    assert new.args == {"mamba-radix-cache-strategy": "extra_buffer", "cuda-graph-max-bs-decode": 32}
    assert ("cuda-graph-max-bs", "cuda-graph-max-bs-decode") in new.renamed
    back = translate_args(new.args, rules_for("0.5.10"))
    assert back.args == args


@pytest.mark.parametrize(
    ("version", "name", "warned"),
    [
        ("0.5.9", "sglang-0.5.9", False),
        ("0.5.10.post1", "sglang-0.5.10.post1", False),
        ("0.5.10.post2", "sglang-0.5.10.post1", True),  # a post release not read: the one before it
        ("0.5.12", "sglang-0.5.12", False),
        ("0.5.15+cu128", "sglang-0.5.15", False),  # a local build of a release read is that release
        ("0.5.21", "sglang-0.5.21", False),
        ("0.5.23", "sglang-0.5.23", False),
        ("0.5.23rc0", "sglang-0.5.23", True),  # a pre-release: the release it becomes, warned
        ("0.5.23.post1", "sglang-0.5.23", True),  # newer than the newest read
        ("0.5.30", "sglang-0.5.23", True),
        ("0.4.0", "sglang-0.5.7", True),  # older than the oldest read
        (None, "sglang-0.5.23", True),
    ],
)
def test_rule_set_selection(version: str | None, name: str, warned: bool) -> None:
    rules, warning = select_rule_set(get_engine("sglang").rule_sets, version)
    assert rules.name == name
    assert (warning is not None) == warned
    if warning and version:
        assert version in warning and "nearest" in warning


def test_release_orders_pre_final_post_and_ignores_local() -> None:
    keys = [release(v) for v in ("0.5.9", "0.5.10rc0", "0.5.10", "0.5.10.post1", "0.5.11.dev2", "0.5.11")]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert release("0.5.15+cu128") == release("0.5.15") == release(" v0.5.15 ")
    assert release("0.5.23rc0").is_prerelease and release("0.5.23rc0") < release("0.5.23")
    assert release("v0.5.10.post1") == release("0.5.10.post1") > release("0.5.10")


@pytest.mark.parametrize("version", ["latest", "main", "0.5.x", "", " "])
def test_a_string_that_is_no_version_plans_with_the_newest_rules_and_says_so(version: str) -> None:
    rules, warning = select_rule_set(get_engine("sglang").rule_sets, version)
    assert rules == max(get_engine("sglang").rule_sets, key=lambda r: r.min_version)
    assert warning is not None and "engine.version" in warning


def test_unknown_engine() -> None:
    with pytest.raises(ConfigError, match="unknown engine"):
        get_engine("tgi")


def test_fatal_signatures_match_the_engines_own_lines() -> None:
    sglang = get_engine("sglang")
    line = (
        "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix "
        "cache when using --mamba-scheduler-strategy no_buffer.To use radix cache ..."
    )
    hits = [s for s in sglang.fatal_signatures_for(rules_for("0.5.13")) if s.search(line)]
    assert hits and "extra_buffer" in hits[0].fix
    assert any(s.search("OSError: [Errno 98] Address already in use") for s in sglang.fatal_signatures)
    assert not any(s.search("INFO: decode batch, #running-req: 3") for s in sglang.fatal_signatures)
    assert all(re.compile(s.pattern) for s in get_engine("vllm").fatal_signatures)


def test_endpoints() -> None:
    assert get_engine("sglang").info_paths == ("/server_info", "/get_server_info")
    assert get_engine("vllm").metrics.gen_throughput == ""  # derived from counters


def test_verdict_parsing_takes_the_marked_line() -> None:
    out = 'noise\nFLEETGEN_PARSER_VERDICT {"ok": false, "version": "0.5.23", "error": "argument error: x"}\n'
    verdict = Engine.parse_verdict(out)
    assert not verdict.is_ok and verdict.version == "0.5.23" and verdict.error == "argument error: x"
    assert "no verdict" in Engine.parse_verdict("Traceback ...").error


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_parser_check_without_the_engine_prints_one_verdict_naming_what_is_missing(kind: str) -> None:
    """The script as the host runs it (`python -c`), under a python that lacks the engine (this one)."""
    engine = get_engine(kind)
    done = subprocess.run(
        [sys.executable, "-c", engine.parser_check_script()],
        input=json.dumps(["--port", "1"]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.count(VERDICT_MARK) == 1 and done.stderr == ""
    verdict = engine.parse_verdict(done.stdout)
    assert not verdict.is_ok and verdict.error == f"ModuleNotFoundError: No module named '{kind}'"


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "::"])
@pytest.mark.parametrize("workdir", ["/w", "/home/u/fleet work", "/tmp/x"])
def test_plan_shows_the_argv_up_launches_for_every_bind(kind: str, bind: str, workdir: str) -> None:
    """`plan` (decide_launch) and `up` (build_command) give one argv, key file included, whatever the workdir:
    the key's config file is named relative to the instance folder the engine runs in."""
    public = bind != "127.0.0.1"
    fleet = _fleet(kind, bind=bind, **({"api_key_env": "MY_KEY"} if public else {}))
    engine = get_engine(kind)
    for inst in fleet.instances():
        planned = decide_launch(fleet.engine, inst, facts_from_file(fleet.host(inst.host)))
        launched = build_command(fleet, engine, inst, workdir)
        assert planned.argv == launched.argv
        assert not any(workdir in a for a in launched.argv)


SRC = Path(fleetgen.__file__).parent


def _engine_name_literals(path: Path) -> list[int]:
    """Lines of `path` holding a string constant that is exactly a registered engine's name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ENGINES
    ]


def test_nothing_outside_the_engine_modules_names_an_engine() -> None:
    """An engine is its module (+ its line in the registries): no other module of fleetgen holds an engine's
    name as a value to branch on or look up by (the simulated SGLang server, which is one engine, aside)."""
    found = {
        str(path.relative_to(SRC)): lines
        for path in sorted(SRC.rglob("*.py"))
        if path.parent.name not in ("engines", "sim") and (lines := _engine_name_literals(path))
    }
    assert found == {}


def test_every_registered_engine_has_plan_arithmetic_and_is_a_fleet_kind() -> None:
    """The plan layer's registry (filled from the engines' plan modules) covers exactly the engines, and the
    config accepts exactly the engines (`config.ENGINE_KINDS`, registered by `fleetgen.engines`)."""
    assert set(PLANNERS) == set(ENGINES) == set(ENGINE_KINDS)
    for name, engine in ENGINES.items():
        assert engine.name == name and PLANNERS[name].engine is engine
        assert engine.distributions and engine.default_launcher and engine.fatal_signatures


def test_no_engine_module_imports_another_engine() -> None:
    """What two engines share lives in engines/base.py: an engine module imports no other engine's module."""
    for name in ENGINES:
        tree = ast.parse((SRC / "engines" / f"{name}.py").read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        others = {f"fleetgen.engines.{other}" for other in ENGINES if other != name}
        assert not imported & others, name


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, and each `from X import name` as `X.name` too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _is_engine_own(where: str) -> bool:
    """The plan layer's registry and each engine's plan module or package (`plan/vllm/`, `plan/sglang/`)."""
    return where == "plan/planners.py" or any(
        where == f"plan/{name}.py" or where.startswith(f"plan/{name}/") for name in ENGINES
    )


def test_engine_knowledge_reaches_the_rest_through_the_registries() -> None:
    """Outside engines/, only the plan layer's engine modules (and its registry) import an engine's modules;
    the rest asks `get_engine` / `planner_of` (plan/fleet.py's host-RAM rule once imported SGLang's)."""
    engine_modules = tuple(f"fleetgen.{layer}.{name}" for layer in ("engines", "plan") for name in ENGINES)
    found = {
        where: sorted(m for m in _imports(path) if m.startswith(engine_modules))
        for path in sorted(SRC.rglob("*.py"))
        if path.parent.name not in ("engines", "sim")
        and not _is_engine_own(where := str(path.relative_to(SRC)))
    }
    assert {where: mods for where, mods in found.items() if mods} == {}


def test_no_module_outside_an_engine_names_its_flags_or_view_keys() -> None:
    """The flags and info keys an engine declares (`max_running_flags`, `view_keys`) are named only in its own
    modules (fleet/status.py once named vLLM's max-num-seqs; deploy/verify.py SGLang's /server_info keys)."""
    declared = {k for e in ENGINES.values() for k in (*e.max_running_flags, *e.view_keys)}
    assert declared
    found = {
        where: hits
        for path in sorted(SRC.rglob("*.py"))
        if path.parent.name not in ("engines", "sim")
        and not _is_engine_own(where := str(path.relative_to(SRC)))
        if (
            hits := sorted(
                {
                    n.value
                    for n in ast.walk(ast.parse(path.read_text()))
                    if isinstance(n, ast.Constant) and n.value in declared
                }
            )
        )
    }
    assert found == {}


def test_no_module_outside_engines_reads_an_engines_reported_figures() -> None:
    """The keys an engine reports its figures under (SGLang's /server_info, vLLM's `cache_config_info`
    labels) are read by its engine module alone (`capacity`, `max_running_from_info`,
    `max_running_from_capacity`, `accept_length`), in src/ and scripts/; http/metrics.py once read
    SGLang's for every engine and capped vLLM's `kv_cache_max_concurrency`, scripts/gpu_scenario.py read
    `internal_states` itself."""
    keys = re.compile(
        r"\b(internal_states|avg_spec_accept_length|effective_max_running_requests_per_dp"
        r"|cache_config_info|kv_cache_max_concurrency|kv_cache_size_tokens)\b"
    )
    paths = [p for p in SRC.rglob("*.py") if p.parent.name not in ("engines", "sim")]
    found = {
        str(path.relative_to(SRC.parent.parent)): sorted(set(keys.findall(path.read_text())))
        for path in sorted([*paths, *(SRC.parent.parent / "scripts").glob("*.py")])
    }
    assert {where: hits for where, hits in found.items() if hits} == {}
