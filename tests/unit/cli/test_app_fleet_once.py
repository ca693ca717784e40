"""Each command reads its fleet file once, at the CLI's edge, and hands the loaded fleet down: deploy/ and
fleet/ never read the file again, and the API key is still remembered for redaction from that one read.

No host is needed: the fleet binds 127.0.0.2 on an SSH host, which every command that reaches a host refuses
before connecting (`deploy.session.open_session`), so each command runs through the deploy layer and stops
there, in-process.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetgen import redact
from fleetgen.cli import _TOPICS
from fleetgen.cli.app import app
from fleetgen.cli.servers import FleetFileServers, URLServers, read_servers
from fleetgen.config import fleet as fleet_config
from fleetgen.config.common import load_toml
from fleetgen.errors import ConfigError
from fleetgen.http.urls import BareURLs

KEY = "k3y-0f_the=fleet~" + "x" * 16
FLEET = """\
[engine]
kind = "sglang"
model = "/m"
bind = "127.0.0.2"
api_key_env = "FLEETGEN_ONCE_KEY"

[[hosts]]
name = "a"
ssh = "u@127.0.0.1:1"
gpus = [0, 1]
"""
NOT_REACHED = "is a's own loopback"  # open_session's refusal: the command got past every read of the file


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["up"], NOT_REACHED),
        (["restart", "--only", "a-1"], NOT_REACHED),
        (["down"], NOT_REACHED),
        (["status", "--json"], NOT_REACHED),
        (["logs", "a-0", "--fleet"], NOT_REACHED),
        (["plan", "--offline"], "engine.model_config is not set"),
        (["run", "in.jsonl", "-o", "out"], "is deployed"),
    ],
)
def test_each_command_reads_its_fleet_file_once(
    argv: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET, encoding="utf-8")
    (tmp_path / "in.jsonl").write_text('{"prompt": "hi"}\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEETGEN_ONCE_KEY", KEY)
    monkeypatch.setattr(redact, "_known", set())
    reads: list[Path] = []

    def counted(file: Path, *args: object, **kwargs: object) -> object:
        reads.append(Path(file))
        return load_toml(file, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fleet_config, "load_toml", counted)
    for topic in _TOPICS:
        importlib.import_module(f"fleetgen.cli.{topic}")
    fleet_flag = [] if argv[-1] == "--fleet" else ["-f"]
    result = CliRunner().invoke(app, [*argv, *fleet_flag, str(path)])
    assert said in " ".join(result.output.split()), result.output
    assert reads == [path], f"the fleet file was read {len(reads)} times"
    assert KEY not in redact.redact(f"a line with {KEY} in it")  # that one read remembered the key


@pytest.mark.parametrize("fleet_flag", [None, "elsewhere.toml"])
def test_fleet_file_or_urls_is_one_rule_for_run_bench_and_dashboard(
    fleet_flag: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--endpoint` URLs win over any fleet file (none is read); without them, `-f`, else ./fleet.toml."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fleet.toml").write_text(FLEET, encoding="utf-8")
    flag = Path(fleet_flag) if fleet_flag else None
    urls = ["http://127.0.0.1:9/", "http://127.0.0.1:9"]
    assert read_servers(flag, urls) == URLServers(BareURLs(tuple(urls)))
    if flag is None:
        source = read_servers(None, None)
        assert isinstance(source, FleetFileServers) and source.fleet.path == Path("fleet.toml")
    else:
        with pytest.raises(ConfigError, match=r"elsewhere\.toml"):
            read_servers(flag, [])
