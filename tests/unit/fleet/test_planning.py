"""Where the job's prompts are counted (`fleet.planning.tokenizer_dir_for`): the model_config folder here,
else the model folder on the first host (a real `local` host: the `Host.read` SSH hosts serve over SFTP);
the engine version `plan` takes from what the hosts report (`version_of_hosts`, pure)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st
from packaging.version import Version
from tokenizers import Tokenizer, models, pre_tokenizers

from fleetgen.config import EngineConfig, FleetFile, JobFile
from fleetgen.deploy.fleet_ref import Fleet
from fleetgen.fleet.planning import tokenizer_dir_for, version_of_hosts
from fleetgen.generate.jobshape import read_job_shape
from tests.fixtures.localfleet import local_fleet


def word_tokenizer_json(words: list[str]) -> str:
    """A real tokenizer.json (the `tokenizers` library's WordLevel): one token a word."""
    tokenizer = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer.to_str()


async def test_model_config_is_read_here_relative_to_the_fleet_file(tmp_path: Path) -> None:
    fleet = local_fleet(tmp_path, model="/nowhere", model_config="../card")
    assert await tokenizer_dir_for(fleet.file, fleet.path, offline=True) == (tmp_path / "card").resolve()


async def test_a_hub_id_or_offline_has_no_tokenizer_to_read(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text(word_tokenizer_json(["why"]))
    assert await tokenizer_dir_for(*_of(local_fleet(tmp_path, model="Qwen/Qwen3-8B")), offline=False) is None
    assert await tokenizer_dir_for(*_of(local_fleet(tmp_path, model=str(model))), offline=True) is None


async def test_the_hosts_model_folder_is_read_and_kept_by_its_content(tmp_path: Path) -> None:
    """The tokenizer on the host counts the prompts exactly (not the 4-bytes estimate); it is kept beside the
    fleet's state under its digest: read again, the same folder; changed on the host, a new one."""
    model = tmp_path / "model"
    model.mkdir()
    fleet = local_fleet(tmp_path, model=str(model))
    assert await tokenizer_dir_for(fleet.file, fleet.path, offline=False) is None  # the host has none
    (model / "tokenizer.json").write_text(word_tokenizer_json(["why", "the", "fleet"]))
    kept = await tokenizer_dir_for(fleet.file, fleet.path, offline=False)
    assert kept is not None and kept.parent == fleet.path.parent / ".fleetgen" / "tokenizers"
    assert (kept / "tokenizer.json").read_text() == (model / "tokenizer.json").read_text()
    assert await tokenizer_dir_for(fleet.file, fleet.path, offline=False) == kept
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": "why the fleet"}) + "\n")
    shape = read_job_shape(JobFile(), prompts, tokenizer_dir=kept, output_lengths=None)
    assert not shape.is_estimate and str(kept) in shape.counted_with
    (model / "tokenizer.json").write_text(word_tokenizer_json(["why"]))
    changed = await tokenizer_dir_for(fleet.file, fleet.path, offline=False)
    assert changed is not None and changed != kept


def _of(fleet: Fleet) -> tuple[FleetFile, Path]:
    return fleet.file, fleet.path


async def test_the_hosts_chat_template_is_kept_with_its_tokenizer(tmp_path: Path) -> None:
    """A run records the template the servers apply from what this keeps: both template files where the
    host has them; a template changed on the host is a new folder (never a stale one)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text(word_tokenizer_json(["why"]))
    (model / "chat_template.jinja").write_text("{{ messages }}")
    (model / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    fleet = local_fleet(tmp_path, model=str(model))
    kept = await tokenizer_dir_for(fleet.file, fleet.path, offline=False)
    assert kept is not None
    for name in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
        assert (kept / name).read_text() == (model / name).read_text()
    (model / "chat_template.jinja").write_text("{{ messages[0] }}")
    changed = await tokenizer_dir_for(fleet.file, fleet.path, offline=False)
    assert changed is not None and changed != kept
    assert (changed / "chat_template.jinja").read_text() == "{{ messages[0] }}"


releases = st.builds(
    "{}.{}.{}{}".format,
    st.integers(0, 1),
    st.integers(0, 12),
    st.integers(0, 30),
    st.sampled_from(["", "rc1", ".post1", "+cu124", ".dev3"]),
)


@given(st.lists(st.one_of(releases, st.none()), max_size=6), st.sampled_from([None, "0.5.9", "0.5.10"]))
@example(["0.5.9", "0.5.10"], None)  # text order would pick 0.5.9
def test_plan_takes_the_newest_release_the_hosts_report(found: list[str | None], wanted: str | None) -> None:
    """Whatever the hosts report, `plan` plans with the newest release of them as releases order (never as
    text: 0.5.9 sorts after 0.5.10 as text), says so where they differ, and takes `engine.version` only where
    no host reported one."""
    values = {"kind": "sglang", "python": "/opt/venv/bin/python", "model": "/m", "version": wanted}
    cfg = EngineConfig.model_validate({k: v for k, v in values.items() if v is not None})
    version, notes = version_of_hosts(cfg, found)
    reported = {v for v in found if v}
    if not reported:
        assert version == wanted and notes == []
        return
    assert version in reported and all(Version(v) <= Version(version) for v in reported)
    differ = [n for n in notes if "different" in n.message]
    assert (len(differ) == 1) is (len(reported) > 1)
    assert all(n.message.endswith(f"planning with {version}") for n in differ)
