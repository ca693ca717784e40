"""`cli.servers`: "fleet file or URLs" is one protocol (`ServerSource`) that `run`, `dashboard` and `bench`
ask, never a branch on which source it is; each source answers its questions right.

The fleet file binds 127.0.0.2 on an SSH host, which every command that reaches a host refuses before
connecting (`deploy.session.open_session`): the fleet source's answers that need no host are checked here,
the others (its job's servers, its rows, its sweep's endpoints) by the integration tests of run, dashboard
and bench on fleets that are up.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgen.cli.servers import (
    DEFAULT_DEAD_TIMEOUT_S,
    FleetFileServers,
    ServerSource,
    URLServers,
    read_servers,
)
from fleetgen.dashboard.fleetdata import EndpointSource
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.errors import FleetDown
from fleetgen.http.urls import BareURLs

SRC = Path(__file__).resolve().parents[3] / "src" / "fleetgen"
# A branch on which source a command was given: what `ServerSource` replaced in cli/ and bench/.
SOURCE_BRANCH = re.compile(
    r"isinstance\([^)]*\b(BareURLs|Fleet|URLServers|FleetFileServers)\b|case (BareURLs|Fleet)\("
)

# Real shapes of what users pass: hosts, ports, a trailing slash, the same server twice, IPv6.
URL = st.builds(
    lambda host, port, slash: f"http://{host}:{port}{slash}",
    st.sampled_from(["127.0.0.1", "gpu-node-07.cluster.local", "[::1]", "10.0.0.2"]),
    st.integers(1, 65535),
    st.sampled_from(["", "/"]),
)
URLS = st.lists(URL, min_size=1, max_size=6)


def write_fleet(tmp_path: Path, model: str, model_config: str | None = None) -> Fleet:
    config = f'model_config = "{model_config}"\n' if model_config else ""
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[engine]\nkind = "sglang"\nmodel = "{model}"\n{config}bind = "127.0.0.2"\n'
        'api_key_env = "FLEETGEN_SERVERS_KEY"\n\n'
        '[[hosts]]\nname = "a"\nssh = "u@127.0.0.1:1"\ngpus = [0]\n',
        encoding="utf-8",
    )
    return Fleet.load(path)


@given(URLS, st.one_of(st.none(), st.floats(0, 1e4)), st.booleans())
def test_bare_urls_answer_with_the_urls_as_given_and_nothing_else(
    urls: list[str], wait_ready: float | None, restart_dead: bool
) -> None:
    source: ServerSource = URLServers(BareURLs(tuple(urls)))
    named = BareURLs(tuple(urls)).named()

    async def ask() -> None:
        assert await source.model_dir() is None
        async with source.for_job(wait_ready, restart_dead) as servers:
            job = servers.of_job
            assert job.endpoints == named and job.describe == {"fleet": {"endpoints": urls}}
            assert (job.api_key, job.engine_kind, job.read_one, job.on_dead) == (None, None, None, None)
            assert (servers.wait_s, servers.dead_timeout_s) == (wait_ready or 0.0, DEFAULT_DEAD_TIMEOUT_S)
            assert servers.caps == {} and servers.fill == frozenset()
            assert "--restart-dead" not in servers.meanwhile(10.0)  # nothing restarts a bare URL
        async with source.for_bench() as bench:
            assert [(e.name, e.url) for e in bench.endpoints] == named
            assert all(e.api_key is None and e.max_running_requests is None for e in bench.endpoints)
            assert await bench.deaths([name for name, _ in named]) == {}
        async with source.for_dashboard() as (rows, note):
            assert isinstance(rows, EndpointSource) and note == ""
            assert [(e.name, e.url) for e in rows.endpoints] == named

    asyncio.run(ask())


def test_read_servers_picks_the_urls_over_a_fleet_file_that_is_not_read(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-fleet.toml"
    assert read_servers(missing, ["http://127.0.0.1:9"]) == URLServers(BareURLs(("http://127.0.0.1:9",)))


@pytest.mark.parametrize("where", ["jinja", "config", "none"])
async def test_a_fleets_model_folder_is_its_tokenizer_folder_where_that_holds_a_chat_template(
    where: str, tmp_path: Path
) -> None:
    """`engine.model_config` (relative to the fleet file) is read here; a folder of the tokenizer alone (no
    template: nothing a run could record) answers None, as a hub id does without reaching a host."""
    folder = tmp_path / "model files"
    folder.mkdir()
    config: dict[str, object] = {"eos_token": "<|im_end|>"}
    if where == "config":
        config["chat_template"] = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
    if where == "jinja":
        (folder / "chat_template.jinja").write_text("{{ messages[0].content }}", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    fleet = write_fleet(tmp_path, "/models/Qwen3-8B", model_config="model files")
    found = await FleetFileServers(fleet).model_dir()
    assert found == (None if where == "none" else folder.resolve())
    hub = write_fleet(tmp_path, "Qwen/Qwen3-8B")  # a hub id: no folder to read anywhere
    assert await FleetFileServers(hub).model_dir() is None


async def test_a_fleet_with_nothing_deployed_refuses_a_job_naming_the_up_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETGEN_SERVERS_KEY", "k" * 32)
    fleet = write_fleet(tmp_path, "/models/Qwen3-8B")
    with pytest.raises(FleetDown, match=re.escape(f"fleetgen up -f {fleet.path}")):
        async with FleetFileServers(fleet).for_job(None, False):
            pytest.fail("a job was given servers of a fleet with none deployed")


def test_no_command_asks_which_source_its_servers_come_from() -> None:
    found = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for folder in ("cli", "bench")
        for path in sorted((SRC / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SOURCE_BRANCH.search(line)
    ]
    assert found == []
