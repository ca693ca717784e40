"""`deploy.script`: the launch script, its secret handling and its sha: pure code (real `sh` runs it).

Once test_deploy_script.py with drift, log and state checks, split by module: test_verify.py,
test_readywait.py, test_state.py.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgen.config import FleetFile
from fleetgen.deploy.script import (
    REDACTOR,
    Command,
    InstancePaths,
    SecretEnv,
    render_script,
)
from fleetgen.deploy.wanted import build_command
from fleetgen.engines import get_engine
from fleetgen.redact import REDACTED
from tests.unit.deploy._helpers import SECRET, command


def test_script_quotes_every_value_and_execs_the_argv(tmp_path: Path) -> None:
    """Run the rendered script with `python` replaced by `printf`, so bash shows what it would exec."""
    s = Command(
        instance="i",
        python="printf",
        launcher=("%s\\n",),
        args=("a b", "$HOME", "'q'", "--x=1"),
        env={"V": "it's $HOME; `x`"},
        paths=InstancePaths.of(str(tmp_path), "i"),
    )
    text = render_script(s)
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    script = tmp_path / "launch.sh"
    script.write_text(text + 'printf "%s" "$V" >&2\n')
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["a b", "$HOME", "'q'", "--x=1"]


# A stand-in engine: says whether its argv holds the key, checks its --config file (SGLang) or its env var
# (vLLM), then prints its own arguments with the key, as SGLang's `server_args=…` line does.
ENGINE = """import json, os, sys
key = os.environ[sys.argv[1]]
args = sys.argv[2:]
print("argv holds the key:", any(key in a for a in args))
if "--config" in args:
    path = args[args.index("--config") + 1]
    text = open(path).read()
    print("config:", json.loads(text.split(": ", 1)[1]) == key, oct(os.stat(path).st_mode & 0o777))
print("server_args=ServerArgs(api_key=" + repr(key) + ", port=1)", flush=True)
print("stderr too: " + key, file=sys.stderr, flush=True)
"""


def _run_public(tmp_path: Path, kind: str) -> tuple[str, str, str]:
    """Render `kind`'s public-bind script with ENGINE as the engine, push the 0600 files, run it: (script
    text, the output as the log would get it, the env var the key travels in)."""
    fleet = FleetFile.model_validate(
        {
            "engine": {"kind": kind, "model": "/m", "bind": "0.0.0.0", "api_key_env": "FLEET_KEY"},
            "hosts": [{"name": "h0", "gpus": [0]}],
        }
    )
    s = build_command(fleet, get_engine(kind), fleet.instances()[0], str(tmp_path))
    secret = s.secret
    assert secret is not None
    s = replace(s, python=sys.executable, launcher=("-c", ENGINE, secret.name))
    text = render_script(s)
    (tmp_path / "h0-0").mkdir()
    for path, data in s.secret_files(SECRET).items():
        Path(path).write_bytes(data)
        Path(path).chmod(0o600)
    (tmp_path / "launch.sh").write_text(text)
    out = subprocess.run(  # in the instance folder, as `up` spawns it
        ["bash", str(tmp_path / "launch.sh")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path / "h0-0",
    )
    return text, out.stdout + out.stderr, secret.name


def test_sglang_key_reaches_it_by_a_0600_config_file_and_never_the_log(tmp_path: Path) -> None:
    """SGLang reads its key from no env var: `--config FILE.yaml` (0600) carries it; what it prints of its
    arguments reaches the log redacted; the script text holds no key."""
    text, log, name = _run_public(tmp_path, "sglang")
    assert name == "FLEET_KEY" and SECRET not in text
    assert "argv holds the key: False" in log and "config: True 0o600" in log
    assert SECRET not in log and log.count(REDACTED) == 2


def test_vllm_public_key_reaches_the_engine_as_its_env_var_not_its_argv(tmp_path: Path) -> None:
    """vLLM reads VLLM_API_KEY: the script exports it from the key file; no --config, no key on argv."""
    text, log, name = _run_public(tmp_path, "vllm")
    assert name == "VLLM_API_KEY" and SECRET not in text
    assert "argv holds the key: False" in log and "config:" not in log
    assert SECRET not in log and log.count(REDACTED) == 2


def _redact_stream(monkeypatch: pytest.MonkeyPatch, key: str, chunks: list[bytes], write_max: int) -> bytes:
    """Run REDACTOR's code in-process over exactly these reads (and writes of at most `write_max` bytes)."""
    reads, written = iter([*chunks, b""]), bytearray()

    def write(_fd: int, data: bytes) -> int:
        written.extend(data[:write_max])
        return min(len(data), write_max)

    monkeypatch.setattr(os, "read", lambda _fd, _n: next(reads))
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "environb", {b"K": key.encode()})
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(sys, "argv", ["-c", "K"])
    exec(REDACTOR, {"__name__": "__main__"})
    return bytes(written)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.text(alphabet="ab=", min_size=16, max_size=24),
    pieces=st.lists(st.sampled_from(["K", "k", "a", "b", "x\n", "\r"]), max_size=40),
    cut_at=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    write_max=st.integers(min_value=1, max_value=64),
)
def test_redactor_removes_every_key_whatever_the_chunking(
    monkeypatch: pytest.MonkeyPatch, key: str, pieces: list[str], cut_at: list[int], write_max: int
) -> None:
    """Keys split across reads, overlapping themselves, half-written at EOF, writes that come back short:
    the log gets exactly the text with each key replaced, and never the key."""
    text = "".join(key if p == "K" else key[: len(key) // 2] if p == "k" else p for p in pieces).encode()
    cuts = sorted({c for c in cut_at if c < len(text)} | {0, len(text)})
    chunks = [text[a:b] for a, b in itertools.pairwise(cuts) if b > a]
    out = _redact_stream(monkeypatch, key, chunks, write_max)
    assert out == text.replace(key.encode(), REDACTED.encode())
    assert key.encode() not in out


def test_missing_key_file_stops_the_script(tmp_path: Path) -> None:
    s = Command(
        instance="i",
        python="printf",
        launcher=("started",),
        args=(),
        env={},
        paths=InstancePaths.of(str(tmp_path), "i"),
        secret=SecretEnv("K"),
    )
    (tmp_path / "launch.sh").write_text(render_script(s))
    out = subprocess.run(["bash", str(tmp_path / "launch.sh")], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "started" not in out.stdout


def test_sha_is_stable_and_changes_with_a_flag() -> None:
    def sha(c: Command) -> str:
        return hashlib.sha256(render_script(c).encode()).hexdigest()

    assert sha(command()) == sha(command())
    assert sha(command()) != sha(command(args=("--port", "2")))
