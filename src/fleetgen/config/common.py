"""What every config file shares: the strict base model, reading a TOML file into a model, and
errors located as `file:line: field`. Pure: `load_toml` reads one file; nothing here touches a host."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from fleetgen.errors import ConfigError


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def dotted(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as the file's reader writes it: `hosts[1].gpus`."""
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")


M = TypeVar("M", bound=BaseModel)


def load_toml(path: Path, model: type[M], what: str) -> M:
    """`path` (the `what`: "fleet file") read into `model`; every error names the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} {path}: {exc.strerror}", fix="check the path, or pass another with -f"
        ) from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8: another encoding, or a binary file by mistake
        raise ConfigError(
            f"the {what} {path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})",
            fix=f"save {path} as UTF-8 (TOML files are UTF-8), or pass another file",
        ) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", fix="fix the syntax at the line named") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _render_validation(path, text, exc, data),
            fix=f"edit {path} as the lines above say; `fleetgen init` writes a commented example",
        ) from exc


def _render_validation(path: Path, text: str, exc: ValidationError, data: Any) -> str:
    lines = [f"{path}: {exc.error_count()} invalid field(s)"]
    for err in exc.errors():
        loc = untagged(tuple(err["loc"]), data)
        field = dotted(loc)
        line = locate(text, loc)
        where = f"{path}:{line}" if line else str(path)
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {field or '(top level)'}: {msg}")
    return "\n".join(lines)


def untagged(loc: tuple[int | str, ...], data: Any) -> tuple[int | str, ...]:
    """`loc` without the tags pydantic puts in it for a union told apart by `kind` (`cluster.ray.gpus` is
    `cluster.gpus` in the file): a part that is the `kind` of the table it stands in, not one of its keys."""
    kept: list[int | str] = []
    for part in loc:
        is_tag = isinstance(data, dict) and part not in data and data.get("kind") == part
        if is_tag:
            continue
        kept.append(part)
        data = data.get(part) if isinstance(data, dict) else _item(data, part)
    return tuple(kept)


def _item(data: Any, part: int | str) -> Any:
    if isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
        return data[part]
    return None


def locate(text: str, loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line number (1-based) of a pydantic `loc` path in a TOML text."""
    rows = text.splitlines()
    start, end = 0, len(rows)
    keys = [p for p in loc if isinstance(p, str)]
    table = ""  # set once the table's header line is found
    if loc and isinstance(loc[0], str):
        name, index = loc[0], (loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None)
        headers = [i for i, r in enumerate(rows) if re.match(rf"^\s*\[\[?\s*{re.escape(name)}\s*\]\]?", r)]
        if headers:
            table = name
            start = headers[index] if index is not None and index < len(headers) else headers[0]
            end = next((i for i in range(start + 1, end) if re.match(r"^\s*\[", rows[i])), end)
            keys = keys[1:]
            if not keys:
                return start + 1
    for key in reversed(keys):
        for i in range(start, end):
            if re.search(rf'(^|[{{,])\s*"?{re.escape(key)}"?\s*=', rows[i]):  # `key =`, or inline `{ key =`
                return i + 1
    if table:  # a field written as its own sub-table: `[engine.args]`
        header = rf"^\s*\[\s*{re.escape(table)}\.{re.escape(keys[0])}\s*\]"
        sub = [i for i, r in enumerate(rows) if re.match(header, r)]
        if sub:
            return sub[0] + 1
    return start + 1 if table else None
