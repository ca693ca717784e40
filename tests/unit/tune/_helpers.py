"""What the tune unit tests share: the model, a GPU class, settings and their measurements, fleet files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetgen.config import FleetFile
from fleetgen.modelcard import load_model_shape
from fleetgen.plan.types import Setting
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.verdict import Measured

MODELS = Path(__file__).parents[2] / "data" / "models"
QWEN = load_model_shape(MODELS / "qwen3.6-27b")
GIB = 1 << 30
H200 = GpuClass(140, 1)


def setting(name: str, running: int, **args: Any) -> Setting:
    return Setting(name, "", args, {}, running, "", 0)


def measured(s: Setting, tps: float | None, cls: GpuClass = H200, error: str = "") -> Measured:
    return Measured(
        cls, s, "h-0", "2026-12-03 10:00 UTC", decode_tps=tps, running=float(s.running), error=error
    )


def fleet_file(hosts: list[dict[str, Any]], args: dict[str, Any] | None = None, tp: int = 1) -> FleetFile:
    engine = {"kind": "sglang", "model": "/m", "tp": tp, "args": args or {}, "version": "0.5.23"}
    return FleetFile.model_validate({"engine": engine, "hosts": hosts})


def _two_class_fleet(tmp_path: Path) -> Path:
    text = f"""
[engine]
kind = "sglang"
version = "0.5.23"
model = "/m"
model_config = "{MODELS / "qwen3.6-27b"}"

[engine.args]
mem-fraction-static = 0.85
reasoning-parser = "qwen3"

[[hosts]]
name = "rtx"
gpus = [0, 1]
gpu_memory_gib = 95.6

[[hosts]]
name = "b200"
gpus = [0]
gpu_memory_gib = 179.1
"""
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path
