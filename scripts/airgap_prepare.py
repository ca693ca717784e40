"""Prepare, on a machine with internet, what an air-gapped GPU host needs to serve a model with a real engine.

    .venv/bin/python scripts/airgap_prepare.py --engine sglang --version 0.5.15 \\
        --config tests/data/models/qwen3.6-27b/config.json --out /tmp/bundle [--fa3] [--chunk-mib 60]

Run by the project's venv (`bash scripts/install-deps.sh` makes it): it reads wheels with `packaging` and
builds the tokenizer with `tokenizers`; another Python stops at once, naming the module it lacks.

Writes OUT/:
  wheels/        the engine's wheel set for the host's Python (cp312 manylinux by default), `--no-deps` each,
                 slimmed where the recipe (shared/reference/gpu.md) shows how: members the engine never loads
                 are removed and the wheel's RECORD rewritten, so pip installs it as usual
  extra/         big members carried apart, as raw deflate (SGLang's FA3 `flash_ops.abi3.so` with --fa3)
  model/         the model's real config.json + a tokenizer padded to its vocabulary (every id decodes) + a
                 Qwen-style chat template with thinking (+ SGLang's processor configs): serve it with
                 `--load-format dummy` (random weights, the real shape, real memory use)
  model-shape/   config.json + model.safetensors.index.json (weight bytes for `fleetgen plan`), when given,
                 + model/'s tokenizer.json (prompts counted as the engine counts them)
  install.sh     on the host: `bash install.sh SITE` installs the wheels into SITE and puts extra/ back
  chunks/cNN/    with --chunk-mib: the whole bundle as one tar cut into pieces (size-limited transfers);
                 `cat chunks/c*/part* | tar -x` reassembles it
Only wheels are fetched (`pip download --only-binary=:all:`); nothing is built. The host's own packages
(torch and what its image ships) are not fetched: `--host-has` names them (default: the H200 image's list,
KINDS.md). A bundle that cannot start the engine is an error (exit 1, naming each gap, before anything is
written): every requirement of the engine's wheels is another of its wheels or on the host — never a wheel
fetched only for fleetgen (`--with-fleetgen`) — and every requirement of the rest is in the bundle or on
the host.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

try:
    from packaging import tags
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ModuleNotFoundError as missing:  # another Python than the project's venv: one line, before any work
    raise SystemExit(
        f"airgap_prepare.py: {sys.executable} has no module {missing.name!r}; run it with the project's "
        "venv, which has it: bash scripts/install-deps.sh, then .venv/bin/python scripts/airgap_prepare.py …"
    ) from None

HERE = Path(__file__).resolve().parent


def words(text: str) -> list[str]:
    return text.split()


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_name(spec: str) -> str:
    """The project a spec names (`flashinfer_python==0.6.12` -> `flashinfer-python`)."""
    return norm(re.split(r"[<>=!~]", spec, maxsplit=1)[0])


PLATFORMS = [
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux1_x86_64",
    "any",
]

# Small wheels both engines' API servers import (gpu.md: found one ImportError at a time on the H200).
COMMON = [
    "pydantic==2.13.4",
    "pydantic-core==2.46.4",
    "annotated-types",
    "typing-inspection",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "watchfiles",
    "python-multipart",
    "pyzmq==27.3.0",
    "msgspec",
    "cbor2",
    "cachetools",
    "blake3",
    "jiter",
    "distro",
    "sniffio",
    "partial-json-parser",
    "pybase64",
    "setproctitle",
    "prometheus-fastapi-instrumentator==8.1.0",
    "compressed-tensors==0.17.0",
    "loguru",
    "depyf==0.20.0",
    "astor",
    "dill",
    "llguidance==1.7.6",
    "outlines_core==0.2.14",
    "diskcache",
    "lark==1.2.2",
    "lm-format-enforcer==0.11.3",
    "interegular",
]
# fleetgen itself on the host (the scenario drives the engine from there): pyproject's dependencies that the
# host lacks, with their compiled needs (the closure check names any other gap).
FLEETGEN_NEEDS = {
    "asyncssh": ["cryptography", "cffi", "pycparser"],
    "pydantic": ["pydantic-core", "annotated-types", "typing-inspection"],
}


def fleetgen_specs(engine_specs: list[str], host_has: list[str]) -> list[str]:
    """fleetgen's runtime dependencies (pyproject.toml) not on the host and not in the engine's set."""
    project = tomllib.loads((HERE.parent / "pyproject.toml").read_text())["project"]
    names = [norm(re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0]) for d in project["dependencies"]]
    names += [n for name in names for n in FLEETGEN_NEEDS.get(name, [])]
    taken = {spec_name(s) for s in engine_specs} | {norm(h) for h in host_has}
    return sorted({n for n in names if n not in taken})


SGLANG_0_5_15 = [
    "sglang==0.5.15",
    "sglang-kernel==0.4.4",
    "flashinfer_python==0.6.12",
    "transformers==5.12.1",
    "tokenizers==0.22.2",
    "apache-tvm-ffi==0.1.11",
    "xgrammar==0.2.9",
    "zstandard",
    "soundfile==0.13.1",
    "openai==2.6.1",
    "openai-harmony==0.0.4",
    "gguf",
    "datasets",
    "multiprocess",
    "easydict",
    "blobfile==3.0.0",
    "pycryptodomex",
    "nvidia-cutlass-dsl==4.5.2",
    "nvidia-cutlass-dsl-libs-cu13==4.5.2",
    "sgl-deep-gemm==0.1.4",
    "nvidia-cudnn-frontend",
    "torchao==0.17.0",
    "ipython",
    "traitlets",
    "jedi",
    "parso",
    "decorator",
    "matplotlib-inline",
    "pexpect",
    "ptyprocess",
    "prompt-toolkit",
    "wcwidth",
    "stack-data",
    "asttokens",
    "executing",
    "pure-eval",
    "ipython-pygments-lexers",
    # sglang's own requirement, soundfile's and cffi's: the H200 image has none of them; fetched for
    # fleetgen alone (--with-fleetgen) they once hid the engine's gap
    "orjson",
    "cffi",
    "pycparser",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    *COMMON,
]


def repin(specs: list[str], pins: list[str], drop: tuple[str, ...] = ()) -> list[str]:
    """`specs`, each name in `pins` re-pinned (it must be in `specs`), the names in `drop` left out."""
    by_name = {spec_name(p): p for p in pins}
    out, seen = [], set()
    for spec in specs:
        name = spec_name(spec)
        if name in drop:
            continue
        out.append(by_name.get(name, spec))
        seen.add(name)
    assert seen >= set(by_name), f"not in the base set: {set(by_name) - seen}"
    return out


# SGLang 0.5.13 (2026-06-15; still refuses spec + no_buffer + radix cache): 0.5.15's set re-pinned to what
# 0.5.13's METADATA requires (`Requires-Dist` diffed): sglang-kernel 0.4.3, sgl-deep-gemm 0.1.2 (which pins
# apache-tvm-ffi==0.1.9), transformers 5.8.1 (tokenizers <=0.23.0: 0.22.2 stays), xgrammar 0.2.1 (the pin;
# 0.2.9 needs tvm-ffi >=0.1.11); flashinfer 0.6.12, openai 2.6.1, openai-harmony 0.0.4, nvidia-cutlass-dsl
# 4.5.2, torchao 0.17.0, soundfile 0.13.1, blobfile 3.0.0 are the same; zstandard is not required by 0.5.13.
SGLANG_0_5_13 = repin(
    SGLANG_0_5_15,
    [
        "sglang==0.5.13",
        "sglang-kernel==0.4.3",
        "sgl-deep-gemm==0.1.2",
        "apache-tvm-ffi==0.1.9",
        "transformers==5.8.1",
        "xgrammar==0.2.1",
    ],
    drop=("zstandard",),
)

# SGLang 0.5.17 (the same torch 2.11 as 0.5.15: the GPU machine runs it as it is): 0.5.15's set re-pinned to
# what 0.5.17's METADATA requires (`Requires-Dist` diffed): sglang-kernel 0.4.5, sgl-deep-gemm 0.1.5.post1,
# flashinfer 0.6.15.post1, nvidia-cutlass-dsl 4.6.0; helion and humming-kernels are new requirements that this
# path never imports (NOT_NEEDED); numba and xxhash are on the host; flashinfer 0.6.15 requires nccl4py and
# cutlass-dsl 4.6's CUDA 13 libraries nvidia-cuda-nvdisasm (both new, both fetched).
SGLANG_0_5_17 = [
    *repin(
        SGLANG_0_5_15,
        [
            "sglang==0.5.17",
            "sglang-kernel==0.4.5",
            "sgl-deep-gemm==0.1.5.post1",
            "flashinfer_python==0.6.15.post1",
            "nvidia-cutlass-dsl==4.6.0",
            "nvidia-cutlass-dsl-libs-cu13==4.6.0",
        ],
    ),
    "nccl4py",
    "nvidia-cuda-nvdisasm",
]

SETS: dict[tuple[str, str], list[str]] = {
    ("vllm", "0.24.0"): [
        "vllm==0.24.0",
        "openai==2.54.0",
        "openai-harmony==0.0.8",
        "xgrammar==0.2.9",
        "apache-tvm-ffi==0.1.15.post2",
        "model-hosting-container-standards==0.1.16",
        "jmespath",
        "supervisor",
        "httpx",
        "anyio",
        "ijson",
        "python-json-logger",
        "jsonschema",
        "jsonschema-specifications",
        "referencing",
        "rpds-py",
        *COMMON,
    ],
    ("sglang", "0.5.17"): SGLANG_0_5_17,
    ("sglang", "0.5.15"): SGLANG_0_5_15,
    ("sglang", "0.5.13"): SGLANG_0_5_13,
}

# Members the engine never loads on a Hopper GPU with the recipe's flags (gpu.md), removed from the wheel.
SLIM: dict[str, list[str]] = {
    "vllm": [
        r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so",  # FA2: Hopper runs FA3 (_vllm_fa3_C kept)
        r"vllm/vllm-rs$",  # the Rust frontend binary
        r"vllm/third_party/deep_gemm/",
        r"vllm/third_party/fmha_sm100/",
    ],
    "sglang": [r"sglang/srt/grpc/_core.*\.so", r"sglang/multimodal_gen/"],
    "xgrammar": [r"xgrammar/lib/.*\.a$"],  # 0.2.1: a 65 MB static library for C++ builds, never loaded
    "sglang_kernel": [r"sgl_kernel/flash_ops\.abi3\.so", r"sgl_kernel/sm100/", r"sgl_kernel/flashmla_ops"],
}
# Members carried apart as the wheel's raw deflate stream (send in pieces); install.sh inflates them.
APART = {"sglang_kernel": [r"sgl_kernel/flash_ops\.abi3\.so"]}

# The H200 image's packages (KINDS.md, 2026-11-17) that the engines' wheels may require.
HOST_HAS = words(
    """transformers tokenizers absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc
anyio attrs certifi charset-normalizer click cloudpickle cmake cuda-bindings cuda-core
cuda-pathfinder cuda-python cuda-toolkit einops filelock frozenlist fsspec grpcio h11 hf-xet
httpcore httpx huggingface-hub idna jinja2 joblib markupsafe msgpack multidict networkx ninja numba
numpy nvidia-ml-py opencv-python-headless packaging pandas pillow pip prometheus-client propcache
protobuf psutil py-cpuinfo pyarrow pybind11 pydantic pygments python-dateutil pyyaml regex requests
rich safetensors scipy sentencepiece setuptools six sympy tabulate tiktoken timm torch torchaudio
torchvision tqdm triton typer typing-extensions urllib3 uvloop wheel xxhash yarl zipp"""
)
# Required by the metadata, never imported on this path (optional backends, other architectures, the gRPC
# router, profilers; vLLM's flashinfer path, off with VLLM_USE_FLASHINFER_SAMPLER=0; cutlass-dsl libs-base:
# libs-cu13 is a whole copy for CUDA 13): not fetched,
# listed so the closure check names only real gaps.
NOT_NEEDED = words(
    """flashinfer-python nvidia-cudnn-frontend nvidia-cutlass-dsl fastsafetensors humming-kernels
exceptiongroup anthropic av decord2 nvidia-cutlass-dsl-libs-base lxml colorama aiocontextvars
win32-setctime flash-attn-4 flashinfer-cubin helion kernels mistral-common modelscope nvidia-mathdx
outlines py-spy quack-kernels smg-grpc-servicer tilelang tokenspeed-mla torch-memory-saver
torchcodec cuda-tile mcp opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp
opentelemetry-semantic-conventions-ai flashinfer-jit-cache build gpt-oss ray
nvidia-cutlass-dsl-libs-cu12 pyobjc lazy-loader"""
)


def download(specs: list[str], dest: Path, python: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        *plat,
        "-d",
        str(dest),
        *specs,
    ]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def wheel_name(path: Path) -> str:
    return norm(path.name.split("-")[0])


def manylinux_glibc(platform: str) -> tuple[int, int]:
    """The glibc a manylinux platform tag needs (PEP 600; the legacy aliases too): newer sorts higher."""
    legacy = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12), "manylinux2014_x86_64": (2, 17)}
    found = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
    return (int(found[1]), int(found[2])) if found else legacy.get(platform, (0, 0))


def target_tags(python: str) -> list[tags.Tag]:
    """The tags the host installs, best first: CPython `python`'s, the newest manylinux first, then `any`."""
    version = tuple(int(part) for part in python.split(".")[:2])
    plats = sorted((p for p in PLATFORMS if p != "any"), key=manylinux_glibc, reverse=True)
    return [*tags.cpython_tags(version, platforms=plats), *tags.compatible_tags(version, platforms=plats)]


def one_per_project(files: list[str], python: str) -> tuple[list[str], list[str]]:
    """(kept, dropped) wheel file names: of one project's wheels the one whose tags fit the host best.

    pip refuses a folder with two wheels of one (name, version) ("conflicting dependencies"); two versions of
    one project mean two specs disagree, which no choice here can settle: SystemExit names both files."""
    rank: dict[tags.Tag, int] = {}
    for i, tag in enumerate(target_tags(python)):
        rank.setdefault(tag, i)
    best: dict[str, tuple[int, Version, str]] = {}  # project -> (rank, version, file)
    dropped = []
    for file in sorted(files):
        name, version, _, wheel_tags = parse_wheel_filename(file)
        fit = min((rank[t] for t in wheel_tags if t in rank), default=None)
        if fit is None:
            raise SystemExit(
                f"{file} does not install on the host (CPython {python}, {', '.join(PLATFORMS)}): delete it "
                "from the wheels folder and run again"
            )
        held = best.get(name)
        if held is not None and held[1] != version:
            raise SystemExit(
                f"two versions of {name} in the bundle: {held[2]} and {file}; pin one version in SETS "
                "(or the --with-fleetgen specs), delete the other wheel and run again"
            )
        if held is None or fit < held[0]:
            dropped += [held[2]] if held else []
            best[name] = (fit, version, file)
        else:
            dropped.append(file)
    return sorted(f for _, _, f in best.values()), dropped


def record_row(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def record_text(rows: list[list[str]]) -> str:
    """RECORD is CSV: a path with a comma (SGLang ships `K=2048,R=64,…json` configs) must be quoted."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def slim(wheel: Path, drop: list[str], apart: list[str], extra: Path) -> tuple[int, int]:
    """Rewrite `wheel` without the members matching `drop`; those matching `apart` go to extra/ (raw)."""
    pats = [re.compile(p) for p in drop]
    keep_apart = [re.compile(p) for p in apart]
    before = wheel.stat().st_size
    out = io.BytesIO()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows: list[list[str]] = []
        for info in src.infolist():
            if info.filename == record_name:
                continue
            if any(p.match(info.filename) for p in keep_apart):
                copy_raw_member(wheel, info, extra / (info.filename + ".deflate"))
            if any(p.match(info.filename) for p in pats):
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            rows.append(record_row(info.filename, data))
        dst.writestr(record_name, record_text([*rows, [record_name, "", ""]]))
    wheel.write_bytes(out.getvalue())
    return before, wheel.stat().st_size


def copy_raw_member(wheel: Path, info: zipfile.ZipInfo, target: Path) -> None:
    """The member's compressed bytes as they sit in the wheel (raw deflate): no recompression here."""
    assert info.compress_type == zipfile.ZIP_DEFLATED
    target.parent.mkdir(parents=True, exist_ok=True)
    with wheel.open("rb") as f, target.open("wb") as g:
        f.seek(info.header_offset)
        header = f.read(30)
        name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
        f.seek(info.header_offset + 30 + name_len + extra_len)
        left = info.compress_size
        while left:
            block = f.read(min(left, 1 << 24))
            g.write(block)
            left -= len(block)


def host_markers(python: str) -> dict[str, str]:
    """The environment markers of the host pip installs on: CPython `python` on Linux x86-64, no extra."""
    return {
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": ".".join(python.split(".")[:2]),
        "python_full_version": python if python.count(".") == 2 else f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "extra": "",
    }


def required_names(requires_dist: list[str], python: str) -> list[str]:
    """The projects `Requires-Dist` lines require on the host: each marker evaluated as pip evaluates it
    there (`implementation_name == "pypy"`, an extra, another platform: not required)."""
    env = host_markers(python)
    reqs = [Requirement(line) for line in requires_dist]
    return [norm(r.name) for r in reqs if r.marker is None or r.marker.evaluate(env)]


def requirements(wheel: Path, python: str) -> list[str]:
    """The projects a wheel requires on the host (its METADATA's `Requires-Dist`, `required_names`)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    lines = [
        ln[len("Requires-Dist:") :].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")
    ]
    return required_names(lines, python)


def closure_gaps(required: dict[str, list[str]], host_has: list[str]) -> dict[str, list[str]]:
    """Each project some project of `required` (project -> what it requires) requires that is neither one
    of them, on the host, nor NOT_NEEDED -> the projects that require it."""
    have = set(required) | {norm(n) for n in host_has} | {norm(n) for n in NOT_NEEDED}
    gaps: dict[str, list[str]] = {}
    for project, names in sorted(required.items()):
        for name in names:
            if name not in have:
                gaps.setdefault(name, []).append(project)
    return gaps


def check_closure(required: dict[str, list[str]], specs: list[str], host_has: list[str], what: str) -> None:
    """SystemExit naming every gap: the engine's own wheels (`specs`) must close over themselves and the
    host (a wheel fetched only for fleetgen, `--with-fleetgen`, fills none of its gaps), then the bundle."""
    engine = {name: needs for name, needs in required.items() if name in {spec_name(s) for s in specs}}
    gaps = {"the engine": closure_gaps(engine, host_has), "fleetgen": closure_gaps(required, host_has)}
    lines = [
        f"  {name}: required by {', '.join(by)} (for {whose}), neither in the bundle nor on the host"
        for whose, found in gaps.items()
        for name, by in sorted(found.items())
        if whose == "the engine" or name not in gaps["the engine"]
    ]
    if lines:
        raise SystemExit(
            f"the bundle cannot start {what} on the host:\n" + "\n".join(lines) + "\nfix: add each to the "
            "engine's set in SETS (or, when the engine never imports it on this path, to NOT_NEEDED; when "
            "the host's image has it, to --host-has) and run again"
        )


# Qwen's added tokens in their order (Qwen2.5-VL / Qwen3 / Qwen3.5): the config's vision ids fall on them.
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "min_pixels": 65536,
    "max_pixels": 16777216,
    "processor_class": "Qwen3VLProcessor",
}
VIDEO_PREPROCESSOR = {**PREPROCESSOR, "video_processor_type": "Qwen3VLVideoProcessor", "fps": 2.0}


def special_base(config: dict[str, object], vocab_size: int) -> int:
    """Where Qwen's added tokens start: from the config's vision_start_token_id (the 10th), else the top."""
    start = config.get("vision_start_token_id")
    if isinstance(start, int) and 9 <= start < vocab_size - len(QWEN_SPECIALS) + 9:
        return start - 9
    return vocab_size - len(QWEN_SPECIALS)


def filler(i: int) -> str:
    """An ordinary byte-level token (decodes to ' fill<letters>'); never produced by encoding."""
    s = ""
    while True:
        s = chr(ord("a") + i % 26) + s
        i //= 26
        if not i:
            return "Ġfill" + s


def padded_tokenizer(config: dict[str, object], out: Path) -> None:
    """A byte-level BPE trained on tests/data/corpus, padded with ordinary tokens to the model's vocab_size,
    Qwen's special tokens at the ids the config names; tokenizer.json + tokenizer_config.json in `out`."""
    text = config.get("text_config", config)
    assert isinstance(text, dict)
    vocab_size = int(text["vocab_size"])
    base = special_base(config, vocab_size)
    small = Tokenizer(models.BPE())
    small.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    small.train(sorted(str(p) for p in (HERE.parent / "tests/data/corpus").glob("*.txt")), trainer)
    model = json.loads(small.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    specials = {tok: base + i for i, tok in enumerate(QWEN_SPECIALS)}
    ids = sorted(vocab.values())
    assert ids == list(range(len(ids))) and len(ids) <= base
    taken, i = set(vocab), 0
    for next_id in range(len(ids), vocab_size):
        if next_id in specials.values():
            continue
        while filler(i) in taken:
            i += 1
        vocab[filler(i)] = next_id
        taken.add(filler(i))
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS])
    assert tok.get_vocab_size() == vocab_size and tok.token_to_id("<|im_end|>") == specials["<|im_end|>"]
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(specials), indent=1))


def tokenizer_config(specials: dict[str, int]) -> dict[str, object]:
    sys.path.insert(0, str(HERE))
    from build_tiny_model import CHAT_TEMPLATE  # the tiny model's Qwen3-style template with <think>

    decoder = {
        str(i): {
            "content": t,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for t, i in specials.items()
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": decoder,
        "chat_template": CHAT_TEMPLATE,
    }


def model_folder(config_path: Path, out: Path, engine: str) -> None:
    (out / "model").mkdir(parents=True, exist_ok=True)
    config = json.loads(config_path.read_text())
    shutil.copy(config_path, out / "model" / "config.json")
    padded_tokenizer(config, out / "model")
    if engine == "sglang" and "ForConditionalGeneration" in str(config.get("architectures")):
        # SGLang treats *ForConditionalGeneration as multimodal and loads AutoProcessor (gpu.md).
        (out / "model" / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
        (out / "model" / "video_preprocessor_config.json").write_text(
            json.dumps(VIDEO_PREPROCESSOR, indent=1)
        )
    index = config_path.parent / "model.safetensors.index.json"
    if index.exists():
        (out / "model-shape").mkdir(exist_ok=True)
        shutil.copy(config_path, out / "model-shape" / "config.json")
        shutil.copy(index, out / "model-shape" / index.name)
        # the served tokenizer beside them: `plan --job` and `tune` count prompts (and the steady start's
        # filler) with the tokens the engine will count, not an estimate
        shutil.copy(out / "model" / "tokenizer.json", out / "model-shape" / "tokenizer.json")


INSTALL_SH = r"""#!/usr/bin/env bash
# bash install.sh SITE [PYTHON]: the wheels into SITE (no index, no deps), big members put back from extra/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); site=${1:?usage: install.sh SITE [PYTHON]}; py=${2:-python3}
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$here"/wheels/*.whl
if [ -d "$here/extra" ]; then
  (cd "$here/extra" && find . -name '*.deflate' | while read -r f; do
     mkdir -p "$site/$(dirname "$f")"
     "$py" "$here/inflate.py" "$f" "$site/${f%.deflate}"
   done)
fi
echo "installed into $site"
"""


INFLATE_PY = """import sys, zlib

d = zlib.decompressobj(-15)
with open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as g:
    while block := f.read(1 << 24):
        g.write(d.decompress(block))
    g.write(d.flush())
"""


def chunk(out: Path, mib: int) -> list[Path]:
    """The bundle (wheels, extra, model, model-shape, install.sh) as one tar cut into ≤ `mib` MiB pieces."""
    chunks = out / "chunks"
    shutil.rmtree(chunks, ignore_errors=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("install.sh", "inflate.py", "model", "model-shape", "wheels", "extra"):
            if (out / name).exists():
                tar.add(out / name, arcname=name)
    data, size, parts = buf.getvalue(), mib << 20, []
    for n, start in enumerate(range(0, len(data), size), 1):
        (chunks / f"c{n:02d}").mkdir(parents=True)
        part = chunks / f"c{n:02d}" / f"part{n:02d}"
        part.write_bytes(data[start : start + size])
        parts.append(part)
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--config", type=Path, required=True, help="the model's config.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--python", default="3.12", help="the host's Python version")
    ap.add_argument("--fa3", action="store_true", help="SGLang: carry FA3 (flash_ops) apart, compressed")
    ap.add_argument("--with-fleetgen", action="store_true", help="also the wheels fleetgen needs there")
    ap.add_argument("--chunk-mib", type=int, default=0, help="cut the bundle into pieces of this size")
    ap.add_argument(
        "--host-has", type=Path, help="file: the host's packages, one a line (default: H200 image)"
    )
    ap.add_argument("--skip-download", action="store_true", help="reuse OUT/wheels as it is")
    a = ap.parse_args()
    specs = SETS.get((a.engine, a.version))
    if specs is None:
        known = ", ".join(f"{e} {v}" for e, v in SETS)
        raise SystemExit(f"no wheel set for {a.engine} {a.version}; known: {known} (add one to SETS)")
    wheels_dir, extra = a.out / "wheels", a.out / "extra"
    host_has = a.host_has.read_text().split() if a.host_has else HOST_HAS
    if not a.skip_download:
        download(specs + (fleetgen_specs(specs, host_has) if a.with_fleetgen else []), wheels_dir, a.python)
    kept, dropped = one_per_project([w.name for w in wheels_dir.glob("*.whl")], a.python)
    for name in dropped:
        (wheels_dir / name).unlink()
        print(f"dropped {name}: another wheel of its release fits the host better")
    wheels = [wheels_dir / name for name in kept]
    required = {wheel_name(w): requirements(w, a.python) for w in wheels}
    check_closure(required, specs, host_has, f"{a.engine} {a.version}")  # before anything is written
    shutil.rmtree(extra, ignore_errors=True)
    for w in wheels:
        name = wheel_name(w).replace("-", "_")
        apart = APART.get(name, []) if a.fa3 else []
        if name in SLIM:
            before, after = slim(w, SLIM[name], apart, extra)
            print(f"slimmed {w.name}: {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    model_folder(a.config, a.out, a.engine)
    (a.out / "install.sh").write_text(INSTALL_SH)
    (a.out / "inflate.py").write_text(INFLATE_PY)
    total = sum(p.stat().st_size for p in a.out.rglob("*") if p.is_file() and "chunks" not in p.parts)
    print(f"bundle: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {a.out}")
    if a.chunk_mib:
        parts = chunk(a.out, a.chunk_mib)
        print(f"{len(parts)} pieces in {a.out / 'chunks'}: cat chunks/c*/part* | tar -x")


if __name__ == "__main__":
    main()
