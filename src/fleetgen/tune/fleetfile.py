"""The fleet files tune writes (pure: data and text in, text out): one per candidate it measures (the
user's fleet narrowed to one instance, renamed and on its own port, with the candidate's flags), and the
tuned fleet file (the winners' flags, each commented with what was measured and when).

The user's file is never written: the tuned one goes beside it (`<fleet>.tuned.toml`) or where `--out`
says; the derived ones into tune's own folder (`.fleetgen/tune/<time>/`), whose `.fleetgen/state.json` is
theirs, so `fleetgen status` of the user's fleet never sees a tune server.

In the tuned file, flags all winners share go in `[engine.args]`, the rest per host in `engine_args`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fleetgen.config import FleetFile, Instance
from fleetgen.tune.classes import GpuClass
from fleetgen.tune.verdict import Measured, ratio

PORT_OFFSET = 100  # a tune server listens this far above the instance's own port (below it near the top)


def file_data(fleet_file: FleetFile, source: Path) -> dict[str, Any]:
    """The fleet file as TOML data (what the user set, no defaults), its model_config made absolute: the
    files tune writes live elsewhere."""
    data = fleet_file.model_dump(mode="json", by_alias=True, exclude_unset=True)
    engine = data["engine"]
    folder = engine.get("model_config")
    if folder and not Path(folder).expanduser().is_absolute():
        engine["model_config"] = str((source.resolve().parent / folder).resolve())
    return data


def candidate_data(
    base: Mapping[str, Any],
    inst: Instance,
    slot: int,
    args: Mapping[str, Any],
    env: Mapping[str, str],
) -> dict[str, Any]:
    """The fleet of one candidate: `base` (`file_data`) with `args` and `env` as its engine's, one host —
    the instance's, renamed `<host>-tune<slot>` (its own instance folder), on its GPUs and its own port."""
    engine = {**base["engine"], "args": dict(args), "env": dict(env)}
    [host] = [h for h in base["hosts"] if h["name"] == inst.host]
    port = inst.port + PORT_OFFSET if inst.port + PORT_OFFSET <= 65000 else inst.port - PORT_OFFSET
    entry = {**host, "name": f"{inst.host}-tune{slot}", "gpus": list(inst.gpus), "base_port": port}
    entry.pop("engine_args", None)  # the candidate's args are whole
    return {**base, "engine": engine, "hosts": [entry]}


def split_args(chosen: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Per host's chosen flags → `[engine.args]` (what every host shares, same value) and each host's
    `engine_args` (the rest): merged back (`FleetFile.engine_for`) each host has exactly its own."""
    hosts = list(chosen.values())
    common = {k: v for k, v in hosts[0].items() if all(k in h and h[k] == v for h in hosts)} if hosts else {}
    return common, {name: {k: v for k, v in a.items() if k not in common} for name, a in chosen.items()}


def tuned_text(
    base: Mapping[str, Any],
    source: Path,
    chosen: Mapping[GpuClass, Measured],
    host_class: Mapping[str, GpuClass],
    baselines: Mapping[GpuClass, Measured | None],
    header: Sequence[str],
) -> str:
    """The tuned fleet file: `base` with each host's class winner's flags (shared ones in `[engine.args]`,
    the rest in the host's `engine_args`), `header` on top, each flag that differs from `source`'s commented
    with what was measured."""
    user_args = dict(base["engine"].get("args", {}))
    # a class with no winner keeps the user's flags
    per_host = {h: dict(chosen[c].setting.args) if c in chosen else user_args for h, c in host_class.items()}
    common, own = split_args(per_host)
    data = {**base, "engine": {**base["engine"], "args": common}}
    env_note = _winners_env(base, chosen)
    if env_note:
        data["engine"]["env"] = {**base["engine"].get("env", {}), **env_note}
    data["hosts"] = [
        {
            **{k: v for k, v in h.items() if k != "engine_args"},
            **({"engine_args": own[h["name"]]} if own.get(h["name"]) else {}),
        }
        for h in base["hosts"]
    ]
    notes = {c: _note(m, baselines.get(c)) for c, m in chosen.items()}
    comments: dict[tuple[str, int], dict[str, str]] = {}
    for i, h in enumerate(data["hosts"]):
        cls = host_class.get(h["name"])
        if cls not in notes:
            continue
        for key, value in per_host[h["name"]].items():
            if user_args.get(key) == value:
                continue  # the user's own flag, kept: nothing to say
            where = ("hosts.engine_args", i) if key in own[h["name"]] else ("engine.args", -1)
            comments.setdefault(where, {}).setdefault(key, notes[cls])
    removed = sorted(set(user_args) - set(common))
    lines = [f"# {line}" for line in header]
    if removed:
        lines.append(
            f"# removed from [engine.args] (the winners do not set them there): {', '.join(removed)}"
        )
    if env_note:
        added = ", ".join(f"{k}={v}" for k, v in env_note.items())
        lines.append(f"# [engine.env] gains {added}: the winners' engine env candidate (tune measured it)")
    lines.append(f"# the user's file: {source} (untouched)")
    return "\n".join(lines) + "\n\n" + _commented(tomli_w.dumps(data), comments)


def _winners_env(base: Mapping[str, Any], chosen: Mapping[GpuClass, Measured]) -> dict[str, str]:
    """The engine env every class's winner measured with beyond the user's (`[engine.env]` is the whole
    fleet's: an env only some winners chose is left out, their flags still apply)."""
    user = dict(base["engine"].get("env", {}))
    extra = [{k: v for k, v in m.setting.env.items() if user.get(k) != v} for m in chosen.values()]
    if not extra:
        return {}
    return {k: v for k, v in extra[0].items() if all(e.get(k) == v for e in extra[1:])}


def _note(m: Measured, baseline: Measured | None) -> str:
    """What one winner measured, for the comment beside each flag it chose."""
    r = ratio(m, baseline)
    than = f", {r:.2f}× the file's own" if r is not None and m is not baseline else ""
    running = f" at {m.running:.0f} running" if m.running is not None else ""
    return (
        f"tune {m.at}: {m.gpu_class.name}: {m.setting.name}, {m.decode_tps_per_gpu:,.0f} decode tok/s per GPU"
        f"{running}{than}"
    )


_TABLE = re.compile(r"^\[\[?([^\]]+)\]\]?$")
_KEY = re.compile(r'^"?([^"=]+?)"? = ')


def _commented(text: str, comments: Mapping[tuple[str, int], Mapping[str, str]]) -> str:
    """`text` (tomli_w's) with `comments[(table, host index)][key]` after each key's line."""
    out, table, host = [], "", -1
    for line in text.splitlines():
        if m := _TABLE.match(line):
            table = m.group(1)
            host += table == "hosts" and line.startswith("[[")
        elif (k := _KEY.match(line)) and table in ("engine.args", "hosts.engine_args"):
            note = comments.get((table, host if table.startswith("hosts") else -1), {}).get(k.group(1))
            if note:
                line = f"{line}  # {note}"
        out.append(line)
    return "\n".join(out) + "\n"
