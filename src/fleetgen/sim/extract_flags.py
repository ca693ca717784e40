"""Run once by hand: dump SGLang's real CLI parser from a release wheel into `sglang_<ver>_flags.json`.

SGLang's parser cannot be imported in fleetgen's venv (it pulls torch, triton, …), so this script builds it
with SGLang's *own* code, `ServerArgs.add_cli_args(argparse.ArgumentParser(prog="sglang serve"))`, in a
scratch interpreter where those heavy modules are replaced by inert stand-ins (they only matter at run time,
never for the shape of the parser), then writes every argparse action as data. The simulator rebuilds an
equivalent parser from that data (`fleetgen.sim.flags`).

Needs a scratch venv with SGLang's light import-time deps (msgspec numpy orjson psutil pybase64 requests
packaging pydantic), e.g.::

    python3 -m venv /tmp/sglenv && /tmp/sglenv/bin/pip install msgspec numpy orjson psutil pybase64 \
        requests packaging pydantic
    PYTHONPATH=src /tmp/sglenv/bin/python -m fleetgen.sim.extract_flags \
        sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl src/fleetgen/sim/sglang_0_5_23_flags.json

The script asserts that no stand-in leaked into a choice list or default (that would mean a flag's shape
depends on a stubbed module and the data would be wrong).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

# Modules SGLang imports at import time that need a GPU stack or are heavy; none shapes a CLI flag.
_STUBBED_TEXT = (
    "torch triton torchcodec torchvision PIL starlette transformers sgl_kernel zmq fastapi uvicorn IPython "
    "tqdm huggingface_hub safetensors einops aiohttp setproctitle pynvml partial_json_parser xgrammar "
    "outlines llguidance compressed_tensors flashinfer openai tiktoken sentencepiece jinja2 modelscope "
    "datasets blobfile uvloop interegular prometheus_client msgpack cuda decord hf_transfer soundfile av "
    "scipy timm pandas yaml ray nvtx kernels tvm_ffi deep_gemm quack cutlass mooncake nixl torchao gguf "
    "peft openai_harmony anthropic grpc tilelang flash_attn mlx watchfiles sse_starlette"
)
STUBBED = frozenset(_STUBBED_TEXT.split())
# `hasattr(torch, "npu")` must be False, or SGLang believes an Ascend NPU is present.
HIDDEN_ATTRS = frozenset({"npu"})


class Inert:
    """A stand-in value: any attribute, call, or operator gives another falsy stand-in."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Inert:
        return Inert(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Inert:
        return Inert(self._name + "()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return ()  # `class X(torch.nn.Module)` becomes a plain class

    def __getitem__(self, key: Any) -> Inert:
        return self

    def __iter__(self) -> Any:
        return iter(())

    def __or__(self, other: Any) -> Inert:
        return self

    __ror__ = __add__ = __radd__ = __mul__ = __rmul__ = __or__

    def __bool__(self) -> bool:
        return False

    def __int__(self) -> int:
        return 0

    __index__ = __len__ = __int__

    def __float__(self) -> float:
        return 0.0

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, other: Any) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __contains__ = __lt__

    def __enter__(self) -> Inert:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __str__(self) -> str:
        return self._name


class InertModule(types.ModuleType):
    """A stubbed module whose attributes are `Inert` stand-ins."""

    def __getattr__(self, name: str) -> Any:
        if (name.startswith("__") and name.endswith("__")) or name in HIDDEN_ATTRS:
            raise AttributeError(name)
        return Inert(f"{self.__name__}.{name}")


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `InertModule`s for the `STUBBED` top-level packages, nothing else."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = InertModule(spec.name)
        module.__path__ = []
        module.__dict__["__version__"] = "2.9.0"  # SGLang parses torch's version at import
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def build_parser(source_root: Path) -> argparse.ArgumentParser:
    """SGLang's own parser, exactly as `prepare_server_args` builds it."""
    sys.meta_path.append(StubFinder())
    # A bare package object skips `sglang/__init__.py`, which patches transformers (irrelevant here).
    package = types.ModuleType("sglang")
    package.__path__ = [str(source_root / "sglang")]
    sys.modules["sglang"] = package
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def action_kind(action: argparse.Action) -> str:
    """The argparse action as a name the simulator's parser builder knows."""
    kinds = {
        "_StoreAction": "store",
        "_StoreTrueAction": "store_true",
        "BooleanOptionalAction": "boolean_optional",
        "DeprecatedStoreTrueAction": "deprecated_store_true",
        "DeprecatedStoreConstAction": "deprecated_store_const",
        "LoRAPathAction": "lora_paths",
        "_HelpAction": "help",
    }
    return kinds[type(action).__name__]


def type_name(action: argparse.Action) -> str | None:
    """argparse `type=` as a name: SGLang's converters are re-implemented in `fleetgen.sim.flags`."""
    if action.type is None:
        return None
    name = getattr(action.type, "__name__", "")
    renamed = {"loads": "json", "json_list_type": "json", "parse_cuda_graph_config_arg": "json"}
    known = {"str", "int", "float", "human_readable_int", "nullable_str", "parse_cuda_graph_backend_arg"}
    if name in renamed:
        return renamed[name]
    assert name in known, f"unknown argparse type {name!r} for {action.option_strings}"
    return "str" if name == "parse_cuda_graph_backend_arg" else name


def plain(value: Any, where: str) -> Any:
    """`value` as JSON data; refuses stand-ins (a flag's shape must not come from a stubbed module)."""
    assert not isinstance(value, Inert), f"a stubbed module leaked into {where}"
    if isinstance(value, set | frozenset | tuple | list):
        return [plain(item, where) for item in value]
    if isinstance(value, dict):
        return {str(key): plain(item, where) for key, item in value.items()}
    assert value is None or isinstance(value, str | int | float | bool), f"{where}: {value!r}"
    return value


def describe(action: argparse.Action) -> dict[str, Any]:
    """One argparse action as data."""
    where = "/".join(action.option_strings)
    entry: dict[str, Any] = {
        "options": action.option_strings,
        "dest": action.dest,
        "action": action_kind(action),
        "nargs": action.nargs,
        "type": type_name(action),
        "choices": plain(list(action.choices), where) if action.choices is not None else None,
        "default": plain(action.default, where),
        "required": action.required,
    }
    if hasattr(action, "new_flag"):
        entry["new_flag"] = action.new_flag
    if hasattr(action, "const_value"):
        entry["const"] = plain(action.const_value, where)
    return entry


def main(argv: list[str]) -> None:
    """`extract_flags WHEEL OUT.json`."""
    wheel, out = Path(argv[0]), Path(argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp, [n for n in archive.namelist() if n.startswith("sglang/")])
        parser = build_parser(Path(tmp))
        flags = [describe(a) for a in parser._actions if action_kind(a) != "help"]
    data = {
        "sglang_version": wheel.name.split("-")[1],
        "source": {"wheel": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
        "prog": parser.prog,
        "flags": flags,
    }
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
