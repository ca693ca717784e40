"""The GPU scripts' pure parts over real captured outputs — no GPU, no engine.

scripts/gpu_scenario.py reads the H200 run's own SGLang log, server info and export
(bench/results/raw/gpu-sglang-0.5.15-h200/) and a vLLM 0.24.0 H200 log; scripts/airgap_prepare.py pads a
tokenizer to Qwen3.6-27B's real vocabulary, slims wheels (RECORD must stay a valid CSV)
and keeps one wheel per project.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.util
import io
import json
import random
import re
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "bench" / "results" / "raw" / "gpu-sglang-0.5.15-h200"
VLLM_LOG = ROOT / "tests" / "data" / "real-engines" / "vllm-0.24.0-h200" / "engine-mtp.log"
QWEN36 = ROOT / "tests" / "data" / "models" / "qwen3.6-27b" / "config.json"


def _load(name: str) -> ModuleType:
    found = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    found.loader.exec_module(module)
    return module


scn = _load("gpu_scenario")
prep = _load("airgap_prepare")


def test_every_batch_line_of_the_real_sglang_log_is_read_in_order() -> None:
    text = (RAW / "spec-engine.log").read_text()
    batches = scn.engine_batches(text)
    expected = [ln for ln in text.splitlines() if re.match(r"^\[[\d -:]+\] (Decode|Prefill) batch", ln)]
    assert len(batches) == len(expected) > 300
    assert [b[0] for b in batches] == sorted(b[0] for b in batches)
    decode = [b for b in batches if b[1] == "Decode"]
    assert decode and all(b[2] is not None and b[3] is not None for b in decode)
    assert max(b[2] for b in decode) == 22  # the engine's "reduced from the requested 48 to 22"


def test_the_engine_view_finds_the_first_batch_stall_in_the_first_clients_window_only() -> None:
    state = json.loads((RAW / "state.json").read_text())["spec"]
    batches = scn.engine_batches((RAW / "spec-engine.log").read_text())
    run, bench = state["run"], state["engine_bench"]
    first = scn.window_view(batches, run["t0"], run["t1"])
    second = scn.window_view(batches, bench["t0"], bench["t1"])
    assert first["longest_stall_s"] >= 90 > second["longest_stall_s"]
    assert first["max_running"] == second["max_running"] == 22
    # Same server, same load: the engine decodes at the same rate under both clients (within 2 %).
    assert abs(first["decode_tok_s_at_full_batch"] / second["decode_tok_s_at_full_batch"] - 1) < 0.02
    assert scn.window_view(batches, 0, 1) == {}  # a window with no batch line says nothing


def test_vllm_stats_lines_are_read_as_decode_samples() -> None:
    text = VLLM_LOG.read_text()
    batches = scn.engine_batches(text)
    assert len(batches) == text.count("Avg generation throughput") > 0
    assert all(b[1] == "Decode" and b[2] is not None and b[3] is not None and b[3] >= 0 for b in batches)


def _scenario(tmp_path: Path) -> object:
    (tmp_path / "raw").mkdir()
    for name in ("spec-server_info.txt", "spec-server_info2.txt"):
        (tmp_path / "raw" / name).write_text((RAW / name).read_text())
    (tmp_path / "raw" / "spec-engine-log.txt").write_text((RAW / "spec-engine.log").read_text())
    return scn.Scenario(argparse.Namespace(out=tmp_path, fleet=RAW / "fleet-sglang.toml"))


def test_actual_capacity_is_the_engines_own_numbers(tmp_path: Path) -> None:
    got = _scenario(tmp_path).actual("spec")  # type: ignore[attr-defined]
    assert got["kv_tokens"] == 535802 and got["max_total_num_tokens_log"] == [535802.0]
    assert got["max_running_requests"] == 22 and got["max_running_requests_arg"] == 48
    assert got["mamba_slots"] == [112.0]


def test_sharegpt_check_accepts_the_real_export_and_names_each_defect(tmp_path: Path) -> None:
    lines = (RAW / "spec-sharegpt.jsonl").read_text().splitlines()
    assert scn.check_sharegpt(RAW / "spec-sharegpt.jsonl", len(lines))["ok"]
    assert not scn.check_sharegpt(RAW / "spec-sharegpt.jsonl", len(lines) + 1)["ok"]  # a row missing
    bad = json.loads(lines[0])
    bad["conversations"][-1]["content"] = ""
    swapped = json.loads(lines[1])
    swapped["conversations"].reverse()
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([json.dumps(bad), json.dumps(swapped), *lines[2:]]) + "\n")
    assert scn.check_sharegpt(path, len(lines)) == {
        "ok": False,
        "records": len(lines),
        "bad": 2,
        "expected": 5,
    }
    assert scn.check_sharegpt(tmp_path / "none.jsonl", 1)["ok"] is False


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model")
    prep.padded_tokenizer(json.loads(QWEN36.read_text()), out)
    return out


def test_the_padded_tokenizer_has_the_models_vocabulary_and_every_id_decodes(padded: Path) -> None:
    from tokenizers import Tokenizer

    config = json.loads(QWEN36.read_text())
    tok = Tokenizer.from_file(str(padded / "tokenizer.json"))
    vocab = config["text_config"]["vocab_size"]
    assert tok.get_vocab_size() == vocab == 248320
    decoded = tok.decode_batch([[i] for i in range(vocab)], skip_special_tokens=False)
    assert all(decoded), "a random-weight model samples any id: every one must decode to text"
    assert tok.token_to_id("<|vision_start|>") == config["vision_start_token_id"]
    assert tok.token_to_id("<|image_pad|>") == config["image_token_id"]
    assert tok.token_to_id("<|video_pad|>") == config["video_token_id"]
    rng = random.Random(3)
    alphabet = "aé漢字🙂\n\t <>|{}\"'\\" + "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(200))
    for _ in range(50):
        text = "".join(rng.choices(alphabet, k=rng.randrange(0, 80)))
        assert tok.decode(tok.encode(text).ids) == text
    cfg = json.loads((padded / "tokenizer_config.json").read_text())
    assert "<think>" in cfg["chat_template"] and cfg["eos_token"] == "<|im_end|>"


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr("pkg-1.0.dist-info/RECORD", "stale,,\n")


def test_slimming_keeps_a_valid_record_and_carries_big_members_apart_byte_exact(tmp_path: Path) -> None:
    rng = random.Random(5)
    big = bytes(rng.randrange(256) for _ in range(300_000)) + b"\0" * 500_000
    members = {
        "pkg/__init__.py": b"x = 1\n",
        "pkg/big.so": big,
        "pkg/cfg/K=2048,R=64,S=1,device=NVIDIA_H200.json": b"{}",  # SGLang ships names with commas
        'pkg/cfg/quote"d.json': b"[]",
        "pkg/drop/gone.py": b"",
        "pkg-1.0.dist-info/METADATA": b"Name: pkg\n",
    }
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    _wheel(wheel, members)
    extra = tmp_path / "extra"
    prep.slim(wheel, [r"pkg/drop/", r"pkg/big\.so"], [r"pkg/big\.so"], extra)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        rows = list(csv.reader(io.StringIO(z.read("pkg-1.0.dist-info/RECORD").decode())))
        kept = {n: z.read(n) for n in names}
    assert names == {n for n in members if not n.startswith(("pkg/drop/", "pkg/big"))} | {
        "pkg-1.0.dist-info/RECORD"
    }
    assert all(len(r) == 3 for r in rows) and {r[0] for r in rows} == names
    for name, digest, size in rows:
        if name.endswith("RECORD"):
            assert digest == size == ""
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(kept[name]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={want}", len(kept[name]))
    raw = (extra / "pkg" / "big.so.deflate").read_bytes()
    inflater = zlib.decompressobj(-15)
    assert inflater.decompress(raw) + inflater.flush() == big


@pytest.mark.parametrize("engine", sorted(prep.SETS))
def test_every_fleetgen_dependency_reaches_the_air_gapped_host_exactly_once(engine: tuple[str, str]) -> None:
    import tomllib

    specs = prep.SETS[engine]
    extra = prep.fleetgen_specs(specs, prep.HOST_HAS)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    fetched = {prep.norm(re.split(r"[<>=!~]", s, maxsplit=1)[0]) for s in specs}
    host = {prep.norm(h) for h in prep.HOST_HAS}
    for dep in deps:
        name = prep.norm(re.split(r"[\s\[<>=!~;]", dep, maxsplit=1)[0])
        assert (name in fetched) + (name in host) + (name in extra) >= 1, name
        assert not (name in extra and name in fetched), (
            f"{name} would be fetched twice (pip refuses two versions)"
        )


# sglang 0.5.13's `Requires-Dist` exact pins (read from sglang-0.5.13-cp312-cp312-manylinux_2_34_x86_64.whl's
# METADATA, markers and extras dropped); cuda-python>=13.0 and the like are ranges, not pins.
SGLANG_0_5_13_PINS = [
    "apache-tvm-ffi==0.1.9",
    "blobfile==3.0.0",
    "flashinfer_cubin==0.6.12",
    "flashinfer_python==0.6.12",
    "nvidia-cutlass-dsl==4.5.2",
    "openai-harmony==0.0.4",
    "openai==2.6.1",
    "outlines==0.1.11",
    "sgl-deep-gemm==0.1.2",
    "sglang-kernel==0.4.3",
    "soundfile==0.13.1",
    "tilelang==0.1.8",
    "timm==1.0.16",
    "tokenspeed_mla==0.1.1",
    "torch==2.11.0",
    "torchao==0.17.0",
    "torchaudio==2.11.0",
    "torchcodec==0.11.1",
    "transformers==5.8.1",
    "xgrammar==0.2.1",
]


def _pins(specs: list[str]) -> dict[str, str]:
    return {prep.norm(s.split("==")[0]): s.split("==")[1] for s in specs if "==" in s}


def test_the_0_5_13_set_fetches_exactly_the_versions_sglang_0_5_13_pins() -> None:
    """Every package of the 0.5.13 set that 0.5.13 pins is fetched at that version (a pin copied from 0.5.15's
    set would be a second version of the engine's world); the rest are shared with the 0.5.15 set; the pins
    of the torch world are the host's own (torch 2.11.0 on the H200: nothing to carry)."""
    fetched, pinned = _pins(prep.SETS[("sglang", "0.5.13")]), _pins(SGLANG_0_5_13_PINS)
    for name, version in fetched.items():
        assert pinned.get(name, version) == version, (name, version, pinned[name])
    missing = set(pinned) - set(fetched) - {prep.norm(n) for n in prep.NOT_NEEDED + prep.HOST_HAS}
    assert not missing, f"pinned by 0.5.13, neither fetched, on the host nor listed as not needed: {missing}"
    assert fetched["sglang"] == "0.5.13" and "sglang-kernel" in fetched
    base = {prep.norm(re.split(r"[<>=!~]", s, maxsplit=1)[0]) for s in prep.SETS[("sglang", "0.5.15")]}
    assert {
        prep.norm(re.split(r"[<>=!~]", s, maxsplit=1)[0]) for s in prep.SETS[("sglang", "0.5.13")]
    } == base - {"zstandard"}
    with pytest.raises(AssertionError, match="not in the base set"):
        prep.repin(prep.SETS[("sglang", "0.5.15")], ["no-such-package==1.0"])


# One project's names as wheel files spell them, its release spelled three ways (PEP 440: one version), build
# tags, and tag sets pip may fetch for CPython 3.12 on x86-64 Linux (compressed sets, abi3, legacy aliases).
SPELLINGS = ["apache_tvm_ffi", "Apache_TVM_FFI", "apache.tvm_ffi", "six", "SIX", "torch_c_dlpack_ext"]
RELEASES = ["0.1.9", "0.1.9.0", "00.1.9"]
FITTING = [
    "cp312-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64",
    "cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64",
    "cp312-cp312-manylinux_2_34_x86_64",
    "cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64",
    "cp39-abi3-manylinux1_x86_64",
    "py3-none-any",
    "py2.py3-none-any",
]
TVM_GPU_DAY = [  # both in the SGLang 0.5.13 bundle on the H200; pip refused to install the pair
    "apache_tvm_ffi-0.1.9-cp312-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "apache_tvm_ffi-0.1.9-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
]


def _fit(file: str) -> int:
    """The best (lowest) place of a wheel's tags in the host's tags; ValueError when none installs there."""
    order: list[Tag] = prep.target_tags("3.12")
    return min(order.index(tag) for tag in parse_wheel_filename(file)[3] if tag in order)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(SPELLINGS),
            st.sampled_from(RELEASES),
            st.sampled_from(["", "-1", "-2b"]),
            st.sampled_from(FITTING),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_bundle_keeps_exactly_one_installable_wheel_per_project_the_best_fitting(
    wheels: list[tuple[str, str, str, str]],
) -> None:
    files = sorted({f"{name}-{release}{build}-{tags}.whl" for name, release, build, tags in wheels})
    kept, dropped = prep.one_per_project(files, "3.12")
    assert sorted(kept + dropped) == files
    project = {f: parse_wheel_filename(f)[0] for f in files}
    assert len({project[f] for f in kept}) == len(kept) and {project[f] for f in kept} == set(
        project.values()
    )
    best = {project[f]: _fit(f) for f in kept}  # _fit raises for a wheel that does not install on the host
    assert all(best[project[f]] <= _fit(f) for f in dropped)


def test_the_gpu_day_pair_keeps_the_newest_manylinux_and_two_versions_or_a_foreign_wheel_stop_prepare() -> (
    None
):
    assert prep.one_per_project(TVM_GPU_DAY, "3.12") == (TVM_GPU_DAY[1:], TVM_GPU_DAY[:1])
    newer = "apache_tvm_ffi-0.1.10-py3-none-any.whl"
    with pytest.raises(SystemExit, match="two versions of apache-tvm-ffi") as stopped:
        prep.one_per_project([*TVM_GPU_DAY, newer], "3.12")
    assert newer in str(stopped.value) and "0.1.9-cp312" in str(stopped.value)
    for foreign in ("six-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", "six-1.0-py3-none-win_amd64.whl"):
        with pytest.raises(SystemExit, match=f"{re.escape(foreign)} does not install on the host"):
            prep.one_per_project([foreign], "3.12")


# Every wheel's `Requires-Dist` of every set, as PyPI serves it (how it was read: the file's `how`).
REQUIRES_DIST = json.loads((ROOT / "tests" / "data" / "airgap" / "requires-dist.json").read_text())["sets"]


@pytest.mark.parametrize("engine", sorted(prep.SETS))
def test_each_engine_set_starts_the_engine_without_fleetgens_wheels(engine: tuple[str, str]) -> None:
    """The engine's own wheels close over themselves and the H200 image: SGLang 0.5.15 once left out
    `orjson` (its own requirement), `cffi` (soundfile's) and `pycparser` (cffi's), fetched only with
    --with-fleetgen, and `airgap_prepare` exited 0 after a warning with a bundle SGLang could not start on."""
    captured = REQUIRES_DIST[" ".join(engine)]
    names = {prep.spec_name(s) for s in prep.SETS[engine]}
    assert names <= set(captured), f"recapture tests/data/airgap/requires-dist.json: {names - set(captured)}"
    for spec in prep.SETS[engine]:
        if "==" in spec:
            assert captured[prep.spec_name(spec)]["version"] == spec.split("==")[1], spec
    required = {n: prep.required_names(captured[n]["requires_dist"], "3.12") for n in names}
    assert prep.closure_gaps(required, prep.HOST_HAS) == {}
    prep.check_closure(required, prep.SETS[engine], prep.HOST_HAS, " ".join(engine))


@pytest.mark.parametrize(
    ("line", "required"),
    [
        ('pycparser; implementation_name != "PyPy"', ["pycparser"]),  # cffi's: CPython needs it
        ('cffi; implementation_name == "pypy"', []),  # pyzmq's: PyPy only
        ("cffi >=1.0", ["cffi"]),
        ('torch; extra == "gpu"', []),
        ('pywin32; sys_platform == "win32"', []),
        (
            'av; sys_platform == "linux" and (platform_machine == "aarch64" or platform_machine == "arm64")',
            [],
        ),
        ('torchcodec==0.11.1; sys_platform != "linux" or platform_machine != "aarch64"', ["torchcodec"]),
        ('tomli; python_version < "3.11"', []),
        ("Flashinfer_Python[cu13]==0.6.12", ["flashinfer-python"]),
    ],
)
def test_a_requirement_counts_where_its_marker_holds_on_the_host(line: str, required: list[str]) -> None:
    assert prep.required_names([line], "3.12") == required


def _dist(folder: Path, name: str, requires: list[str]) -> None:
    """A wheel whose METADATA requires `requires` (nothing else in it matters to the closure check)."""
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\n{meta}")


def test_a_bundle_that_cannot_start_the_engine_exits_non_zero_naming_each_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cryptography` is in the folder (as `--with-fleetgen` fetches it), not in the engine's set: it fills
    none of the engine's gaps. Nothing of the bundle is written."""
    wheels = tmp_path / "out" / "wheels"
    wheels.mkdir(parents=True)
    _dist(wheels, "sglang", ["orjson", "soundfile==0.13.1", "cryptography", "numpy"])
    _dist(wheels, "soundfile", ["cffi >=1.0", 'cffi; implementation_name == "pypy"'])
    _dist(wheels, "cryptography", ["cffi>=1.14"])
    argv = ["airgap_prepare.py", "--engine", "sglang", "--version", "0.5.15", "--config", str(QWEN36)]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "out"), "--skip-download"])
    with pytest.raises(SystemExit) as stopped:
        prep.main()
    said = str(stopped.value.code)
    assert said.startswith("the bundle cannot start sglang 0.5.15 on the host")
    assert "orjson: required by sglang (for the engine)" in said
    assert "cryptography: required by sglang (for the engine)" in said
    assert "cffi: required by soundfile (for the engine)" in said and "cryptography (for" not in said
    assert "numpy" not in said  # on the host
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["wheels"]


@pytest.mark.parametrize(
    ("python", "module"),
    [
        (
            ["-c", "import sys; sys.modules['tokenizers'] = None; import runpy; runpy.run_path(sys.argv[1])"],
            "tokenizers",
        ),
        (["-I", "-S"], "packaging"),  # a Python with no site-packages: what a system Python lacks first
    ],
    ids=["without tokenizers", "without site-packages"],
)
def test_airgap_prepare_run_by_another_python_is_one_line_naming_the_module_and_the_fix(
    tmp_path: Path, python: list[str], module: str
) -> None:
    """Outside the project's venv it used to stop at the tokenizer with a traceback ending in
    `ModuleNotFoundError` (issue 30): it stops before any work, in one line, naming what is missing."""
    script = ROOT / "scripts" / "airgap_prepare.py"
    argv = [sys.executable, *python, str(script), "--engine", "vllm", "--version", "0.24.0"]
    done = subprocess.run(
        [*argv, "--config", str(QWEN36), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert f"has no module {module!r}" in line and sys.executable in line
    assert "bash scripts/install-deps.sh, then .venv/bin/python scripts/airgap_prepare.py" in line
    assert list(tmp_path.iterdir()) == []  # nothing written
