"""Fleet file validation: errors name the file, the line and the field; instances expand from tp and ports.

Also `fleetgen init`: the example it writes is a valid fleet file, and it never overwrites.

Filed under `config/fleet.py` (the fleet file), with `config/hosts.py`'s entries, `config/common.py`'s
`locate` and `cli/init.py`'s example as the fleet file reads them.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import fleetgen.cli.hosts
import fleetgen.cli.init  # noqa: F401  (registers `init` on the app)
from fleetgen.cli.app import app
from fleetgen.config import FleetFile, HostEntry, load_fleet, load_job, locate
from fleetgen.errors import ConfigError

GOOD = """\
[engine]
kind = "sglang"
model = "/models/m"

[[hosts]]
name = "a"
ssh = "root@10.0.0.1:2222"
gpus = [0, 1, 2, 3]

[[hosts]]
name = "b"
ssh = "b.example"
gpus = [4, 5]
base_port = 31000
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> ConfigError:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    return caught.value


def _line_of(text: str, needle: str, occurrence: int = 0) -> int:
    lines = [i + 1 for i, row in enumerate(text.splitlines()) if needle in row]
    return lines[occurrence]


def test_good_file_loads_and_parses_ssh_targets(tmp_path: Path) -> None:
    fleet = load_fleet(_write(tmp_path, GOOD))
    a, b = fleet.hosts
    assert (a.user, a.address, a.port, a.is_local) == ("root", "10.0.0.1", 2222, False)
    assert (b.user, b.address, b.port) == (None, "b.example", 22)
    assert HostEntry(name="here").is_local


def test_bad_type_in_second_host_names_file_line_and_field(tmp_path: Path) -> None:
    text = GOOD.replace("base_port = 31000", 'base_port = "high"')
    err = _error(tmp_path, text)
    path = tmp_path / "fleet.toml"
    line = _line_of(text, 'base_port = "high"')
    assert f"{path}:{line}: hosts[1].base_port:" in err.message
    assert "integer" in err.message
    assert "fleetgen init" in err.fix


def test_unknown_key_is_an_error_not_ignored(tmp_path: Path) -> None:
    text = GOOD.replace('model = "/models/m"', 'model = "/models/m"\nmodle_path = "/typo"')
    err = _error(tmp_path, text)
    line = _line_of(text, "modle_path")
    assert re.search(rf"fleet\.toml:{line}: engine\.modle_path: Extra inputs are not permitted", err.message)


def test_unknown_key_in_a_host(tmp_path: Path) -> None:
    text = GOOD.replace('ssh = "b.example"', 'ssh = "b.example"\nport = 22')
    err = _error(tmp_path, text)
    assert f"fleet.toml:{_line_of(text, 'port = 22')}: hosts[1].port:" in err.message


def test_public_bind_without_api_key_env(tmp_path: Path) -> None:
    text = GOOD.replace('model = "/models/m"', 'model = "/models/m"\nbind = "0.0.0.0"')
    err = _error(tmp_path, text)
    assert f"fleet.toml:{_line_of(text, '[engine]')}: engine:" in err.message
    assert "api_key_env" in err.message
    text_ok = text.replace('bind = "0.0.0.0"', 'bind = "0.0.0.0"\napi_key_env = "KEY"')
    assert load_fleet(_write(tmp_path, text_ok)).engine.is_public


def test_flag_written_with_dashes_names_the_bare_name(tmp_path: Path) -> None:
    text = GOOD.replace(
        'model = "/models/m"', 'model = "/models/m"\n\n[engine.args]\n"--mem-fraction-static" = 0.8'
    )
    err = _error(tmp_path, text)
    assert "engine.args:" in err.message
    assert "'mem-fraction-static', not '--mem-fraction-static'" in err.message
    assert f"fleet.toml:{_line_of(text, '[engine.args]')}:" in err.message  # the table holding the flag


def test_managed_flags_are_refused(tmp_path: Path) -> None:
    text = GOOD.replace('model = "/models/m"', 'model = "/models/m"\nargs = { port = 1234 }')
    assert "set by fleetgen per instance" in _error(tmp_path, text).message


def test_bad_ssh_form_and_repeated_gpus_and_duplicate_hosts(tmp_path: Path) -> None:
    assert "user@host:port" in _error(tmp_path, GOOD.replace('"b.example"', '"a@b@c"')).message
    assert "two instances would share one GPU" in _error(tmp_path, GOOD.replace("[4, 5]", "[4, 4]")).message
    assert "host names repeat: a" in _error(tmp_path, GOOD.replace('name = "b"', 'name = "a"')).message


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    err = _error(tmp_path, "[engine\nkind=")
    assert "not valid TOML" in err.message and str(tmp_path / "fleet.toml") in err.message
    with pytest.raises(ConfigError, match="cannot read the fleet file"):
        load_fleet(tmp_path / "absent.toml")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=50)
@given(data=st.binary(min_size=1).filter(lambda b: not _is_utf8(b)))
def test_a_file_that_is_not_utf8_is_refused_naming_it(data: bytes) -> None:
    """A fleet or job file in another encoding (or a binary by mistake): an error naming the file and the
    fix, never a traceback (the fleet file option reads it before any command runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.toml"
        path.write_bytes(data)
        for load in (load_fleet, load_job):
            with pytest.raises(ConfigError) as err:
                load(path)
            assert str(path) in err.value.message and "not UTF-8" in err.value.message and err.value.fix


def test_instances_expand_by_tp_with_per_host_base_port(tmp_path: Path) -> None:
    text = GOOD.replace('model = "/models/m"', 'model = "/models/m"\ntp = 2\nbase_port = 30000')
    fleet = load_fleet(_write(tmp_path, text))
    got = [(i.name, i.host, i.gpus, i.port, i.index) for i in fleet.instances()]
    assert got == [
        ("a-0", "a", (0, 1), 30000, 0),
        ("a-1", "a", (2, 3), 30001, 1),
        ("b-0", "b", (4, 5), 31000, 0),  # host b's own base_port
    ]


def test_instances_for_all_gpus_use_detected_indices() -> None:
    fleet = FleetFile.model_validate(
        {
            "engine": {"kind": "vllm", "model": "/m", "tp": 1},
            "hosts": [{"name": "x", "ssh": "x", "gpus": "all"}],
        }
    )
    assert [i.gpus for i in fleet.instances({"x": [0, 1, 2]})] == [(0,), (1,), (2,)]
    assert [i.port for i in fleet.instances({"x": [0, 1, 2]})] == [30000, 30001, 30002]
    # tp=2 over 3 detected GPUs: refused (GPU 2 would sit unused without a word), naming file, line, fix
    tp2 = fleet.model_copy(update={"engine": fleet.engine.model_copy(update={"tp": 2})})
    with pytest.raises(ConfigError) as caught:
        tp2.instances({"x": [0, 1, 2]})
    assert "hosts[0].gpus" in caught.value.message and "GPU 2 unused" in caught.value.message
    assert "gpus = [0, 1]" in caught.value.fix
    with pytest.raises(ConfigError, match="no GPU, so no instance"):
        fleet.instances({"x": []})


def test_detected_gpus_tp_does_not_divide_name_the_fleet_files_line(tmp_path: Path) -> None:
    path = _write(tmp_path, '[engine]\nkind = "vllm"\nmodel = "/m"\ntp = 2\n\n[[hosts]]\nname = "x"\n')
    with pytest.raises(ConfigError) as caught:
        load_fleet(path).instances({"x": [0, 1, 2]}, source=path)
    assert caught.value.message.startswith(f'{path}:6: hosts[0].gpus: gpus = "all" found [0, 1, 2] on x')


def test_locate_finds_nested_keys() -> None:
    assert locate(GOOD, ("hosts", 1, "gpus")) == _line_of(GOOD, "gpus = [4, 5]")
    assert locate(GOOD, ("engine", "model")) == _line_of(GOOD, "model =")


def test_init_writes_a_valid_example_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    runner = CliRunner()
    first = runner.invoke(app, ["init", str(path)])
    assert first.exit_code == 0, first.output
    fleet = load_fleet(path)
    assert fleet.engine.kind in ("sglang", "vllm") and len(fleet.hosts) >= 1
    text = path.read_text()
    assert text.count("#") > 10  # commented
    kind_line = next(line for line in text.splitlines() if line.startswith("kind ="))
    from fleetgen.engines import ENGINES

    assert all(f'"{known}"' in kind_line for known in ENGINES)  # the comment names every registered engine
    second = runner.invoke(app, ["init", str(path)])
    assert second.exit_code == 2
    assert path.read_text() == text


@pytest.mark.parametrize(
    "kind", ["tgi", "SGLang", " sglang", "vllm\\n", "", "sglang;rm -rf /", "ѕglang", "vllm-cpu"]
)
def test_an_engine_kind_not_registered_is_refused_naming_file_line_field_and_every_known_engine(
    tmp_path: Path, kind: str
) -> None:
    """engine.kind is checked against the engine registry (`fleetgen.engines.ENGINES`), not a list in config:
    every registered engine is accepted, anything else (case, spaces, a look-alike letter, a distribution
    name) is refused at its line, and the message names each engine fleetgen knows."""
    from fleetgen.engines import ENGINES

    for known in ENGINES:
        assert (
            load_fleet(_write(tmp_path, GOOD.replace('kind = "sglang"', f'kind = "{known}"'))).engine.kind
            == known
        )
    text = GOOD.replace('kind = "sglang"', f'kind = "{kind}"')
    message = _error(tmp_path, text).message
    assert f"fleet.toml:{_line_of(text, 'kind =')}: engine.kind: unknown engine" in message
    assert all(repr(known) in message for known in ENGINES)
