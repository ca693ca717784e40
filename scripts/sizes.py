"""House limits, checked: a module ≤ 400 lines, a function ≤ 40 lines (style.md, principle 12).

    python scripts/sizes.py [PATH ...]      (default: src/fleetgen)

Prints each offender as `path:line: what` and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 40


def offenders(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = []
    num_lines = len(text.splitlines())
    if num_lines > MAX_MODULE_LINES:
        found.append(f"{path}:1: module has {num_lines} lines (limit {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - first + 1
            if length > MAX_FUNCTION_LINES:
                limit = f"(limit {MAX_FUNCTION_LINES})"
                found.append(f"{path}:{node.lineno}: {node.name}() has {length} lines {limit}")
    return found


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path("src/fleetgen")]
    files = sorted(p for root in roots for p in ([root] if root.is_file() else root.rglob("*.py")))
    problems = [line for f in files for line in offenders(f)]
    print("\n".join(problems) if problems else f"sizes: {len(files)} modules within the limits")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
