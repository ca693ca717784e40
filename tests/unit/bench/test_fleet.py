"""`fleetgen bench` over a fleet: targets per scope, and the spec-off fleet file of `--compare-spec`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.bench.fleet import running_caps, targets_of, write_spec_off
from fleetgen.bench.stats import BenchTarget
from fleetgen.config import load_fleet
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.errors import ConfigError
from fleetgen.fleet.pool import Link
from fleetgen.http.urls import named_urls

PAIRS = [("h0-0", "http://127.0.0.1:1"), ("h0-1", "http://127.0.0.1:2")]

FLEET = """\
[engine]
kind = "sglang"
model = "/models/Qwen3"
served_model_name = "q"

[engine.args]
speculative-algorithm = "EAGLE"
speculative-num-steps = 3
mem-fraction-static = 0.85
enable-metrics = true
chunked-prefill-size = 8192

[engine.env]
SGLANG_X = "a \\"quoted\\" value"

[[hosts]]
name = "gpu-a"
ssh = "ubuntu@10.0.0.1:2222"
gpus = [0, 1]

[[hosts]]
name = "gpu-b"
gpus = "all"
"""


def test_targets_per_scope() -> None:
    both = targets_of(PAIRS, "both")
    assert both == [
        BenchTarget("h0-0", ("http://127.0.0.1:1",)),
        BenchTarget("h0-1", ("http://127.0.0.1:2",)),
        BenchTarget("fleet", ("http://127.0.0.1:1", "http://127.0.0.1:2")),
    ]
    assert [t.name for t in targets_of(PAIRS, "instances")] == ["h0-0", "h0-1"]
    assert [t.name for t in targets_of(PAIRS, "fleet")] == ["fleet"]
    assert [t.name for t in targets_of(PAIRS[:1], "both")] == ["h0-0"]  # one instance: it is the fleet
    assert [t.name for t in targets_of(PAIRS[:1], "fleet")] == ["fleet"]


def test_spec_off_drops_only_speculative_args(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    off = write_spec_off(Fleet.load(path)).path
    assert off == tmp_path / "fleet.spec-off.toml"
    original, written = load_fleet(path), load_fleet(off)
    assert written.engine.args == {
        "mem-fraction-static": 0.85,
        "enable-metrics": True,
        "chunked-prefill-size": 8192,
    }
    assert written.model_copy(update={"engine": original.engine}) == original
    assert written.engine.model_copy(update={"args": original.engine.args}) == original.engine


def test_spec_off_refuses_a_fleet_without_spec(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.replace('speculative-algorithm = "EAGLE"\nspeculative-num-steps = 3\n', ""))
    with pytest.raises(ConfigError, match="no speculative decoding flags") as info:
        write_spec_off(Fleet.load(path))
    assert "--compare-spec" in info.value.fix
    assert not (tmp_path / "fleet.spec-off.toml").exists()


UGLY = """\
[engine]
kind = "vllm"
model = '/models/with "quotes" and \\ backslash/ünï'
env = { "WITH SPACE" = "line one\\nline two\\ttab \\\\ back", "EMPTY" = "" }

[engine.args]
speculative-config = '{"method": "eagle", "num_speculative_tokens": 3}'
"weird key" = [1, 2.5, "x"]
"a.b" = true

[[hosts]]
name = "gpu-a"
ssh = "ubuntu@10.0.0.1:2222"
gpus = [0, 1]
"""


def test_spec_off_writes_back_every_other_value_as_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(UGLY, encoding="utf-8")
    before = tomllib.loads(UGLY)
    after = tomllib.loads(write_spec_off(Fleet.load(path)).path.read_text(encoding="utf-8"))
    del before["engine"]["args"]["speculative-config"]
    assert after == before


@given(
    st.lists(
        st.sampled_from(["http://127.0.0.1:30000", "http://10.0.0.2:8000/", "https://gpu-1:443"]), max_size=8
    )
)
def test_bare_urls_are_named_by_their_address_once_each(urls: list[str]) -> None:
    """`run`, `bench` and the dashboard name bare `--endpoint` URLs alike: by the address, each name once (a
    URL given again is that address and its place), every URL kept in order."""
    named = named_urls(urls)
    assert [url for _, url in named] == [u.rstrip("/") for u in urls]
    assert len({name for name, _ in named}) == len(urls)
    for name, url in named:
        assert name.split("#")[0] == url.split("://", 1)[1]


@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(1, 4096)), st.booleans()), max_size=8))
def test_a_floor_caps_no_sweep(figures: list[tuple[int | None, bool]]) -> None:
    """A sweep's levels stop at an engine's max running requests, but not at a floor it runs past (vLLM
    without max-num-seqs says its concurrency at max-model-len): that one caps nothing."""
    links = [Link(f"s{i}", "u", None, n, running_is_floor=floor) for i, (n, floor) in enumerate(figures)]
    assert running_caps(links) == [None if floor else n for n, floor in figures]
