"""SGLang 0.5.23's `--config FILE.yaml`: flags read from a YAML file, merged in front of the command line.

A port of `sglang/srt/utils/server_args_config_parser.py::ConfigArgumentMerger` as `prepare_server_args`
uses it (in-process: /proc still shows `--config FILE`, the merged argv is what the parser sees). Values:
`true` → the bare flag of a store_true option (`false` → omitted), a list → the flag then each item, a
mapping → its JSON, anything else → `str(value)`; options of other actions are refused; the command line
wins over the file (argparse: the last value of a flag counts). fleetgen passes the API key this way, so it
never shows on the argv that `ps` prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

FLAG = "--config"


def _config_keys(action: argparse.Action) -> set[str]:
    """YAML keys may use any long spelling of a flag, not just the one matching dest."""
    return {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--")}


def _takes_one_value(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreAction) or action.nargs is None


def merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with the config file's flags put first and `--config FILE` removed (SGLang's order)."""
    at = [i for i, arg in enumerate(argv) if arg == FLAG]
    if not at:
        return argv
    if len(at) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if at[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at[0] + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    with path.open() as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    return _to_args(parser, data) + argv[: at[0]] + argv[at[0] + 2 :]


def _to_args(parser: argparse.ArgumentParser, config: dict[str, Any]) -> list[str]:
    store_true = {
        k for a in parser._actions if isinstance(a, argparse._StoreTrueAction) for k in _config_keys(a)
    }
    supported = [
        a for a in parser._actions if isinstance(a, argparse._StoreTrueAction) or _takes_one_value(a)
    ]
    supported_keys = {k for a in supported for k in _config_keys(a)}
    unsupported = {
        k: a
        for a in parser._actions
        if a.option_strings and a not in supported and not {FLAG, "--help", "-h"} & set(a.option_strings)
        for k in _config_keys(a)
        if k not in supported_keys
    }
    args: list[str] = []
    for key, value in config.items():
        norm = key.replace("-", "_")
        if norm in unsupported:
            kind = unsupported[norm].__class__.__name__
            raise ValueError(f"Unsupported config option '{norm}' with action '{kind}'")
        if isinstance(value, bool):
            if norm not in store_true:
                args += [f"--{key}", str(value).lower()]
            elif value:
                args.append(f"--{key}")
        elif isinstance(value, list):
            if value:
                args += [f"--{key}", *(str(item) for item in value)]
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return args
