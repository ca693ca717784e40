"""The model's shape, as `plan`, `up` and the dashboard all read it (`model_shape`): `engine.model_config`
read here, else the model folder read on a host over its connection; never a local folder that merely has
the model's name.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from pathlib import Path
from typing import Any

from fleetgen.config import EngineConfig
from fleetgen.errors import ModelCardError, RemoteError
from fleetgen.modelcard import ModelShape, load_model_shape, parse_model_shape
from fleetgen.remote.base import Host


def is_path_like(model: str) -> bool:
    """A local folder (checked on the host) rather than a hub id like `Qwen/Qwen3-8B`."""
    return model.startswith(("/", "~", "./", "../"))


def local_shape(folder: str, fleet_path: Path) -> ModelShape:
    """A model folder read here; a relative path is relative to the fleet file."""
    path = Path(folder).expanduser()
    return load_model_shape(path if path.is_absolute() else fleet_path.parent / path)


async def host_shape(host: Host, folder: str) -> ModelShape:
    """A model folder read on `host` over its connection: `config.json`, and the index when there."""
    config = await _host_json(host, posixpath.join(folder, "config.json"))
    index = None
    with contextlib.suppress(ModelCardError):
        index = await _host_json(host, posixpath.join(folder, "model.safetensors.index.json"))
    return parse_model_shape(config, index)


MODEL_CONFIG_FIX = 'set engine.model_config = "<local folder with config.json>" in {}'


async def model_shape(cfg: EngineConfig, fleet_path: Path, host: Host | None) -> ModelShape:
    """The model's shape, as `plan` and `up` both read it: `engine.model_config` here (relative to the fleet
    file), else `engine.model` read on `host` (a fleet's first host; None: none reached), never a folder here
    that merely has the same name. ModelCardError says why none could be read."""
    if cfg.model_config_dir:
        return local_shape(cfg.model_config_dir, fleet_path)
    fix = MODEL_CONFIG_FIX.format(fleet_path)
    if not is_path_like(cfg.model):
        raise ModelCardError(
            f"engine.model {cfg.model!r} is a hub id: no folder to read config.json in", fix=fix
        )
    if host is None:
        raise ModelCardError(f"{cfg.model} is on the hosts, and none was reached to read it on", fix=fix)
    return await host_shape(host, cfg.model)


_HOST_JSON_FIX = (
    "set engine.model to the model folder on the host, or engine.model_config to a local copy of its "
    "config.json"
)


async def _host_json(host: Host, path: str) -> dict[str, Any]:
    try:
        raw = await host.read(path)
    except RemoteError as exc:
        # One line, said once: the host's own "cannot read PATH on HOST: why" (never its str(): that adds
        # its context and its fix, and `up`'s warning adds another fix) is the message.
        said = exc.message
        message = said if said.startswith("cannot read ") else f"cannot read {path} on {host.name}: {said}"
        raise ModelCardError(message, fix=_HOST_JSON_FIX) from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ModelCardError(f"{path} on {host.name} is not JSON: {exc}", fix=_HOST_JSON_FIX) from exc
    if not isinstance(data, dict):
        raise ModelCardError(f"{path} on {host.name} is not a JSON object", fix="check the model folder")
    return data
