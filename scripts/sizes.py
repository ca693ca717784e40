"""The module-size guide (style.md, principle 12): a module over ~400 lines is a smell, not a wall.

    python scripts/sizes.py [PATH ...]      (default: src/fleetgen)

Prints each module over the guide as `path:1: warning: …` so a reviewer looks at it, and always exits 0:
the size is a smell detector, not a target. Functions have no line limit: a long function is split by
meaning, or left long, never crammed (no `# fmt: skip` to save lines).
"""

from __future__ import annotations

import sys
from pathlib import Path

MODULE_LINES_GUIDE = 400


def warnings(path: Path) -> list[str]:
    num_lines = len(path.read_text(encoding="utf-8").splitlines())
    if num_lines <= MODULE_LINES_GUIDE:
        return []
    return [f"{path}:1: warning: {num_lines} lines (guide: ~{MODULE_LINES_GUIDE}); does it do one job?"]


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [Path("src/fleetgen")]
    files = sorted(p for root in roots for p in ([root] if root.is_file() else root.rglob("*.py")))
    found = [line for f in files for line in warnings(f)]
    print(
        "\n".join(found)
        if found
        else f"sizes: {len(files)} modules within the ~{MODULE_LINES_GUIDE}-line guide"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
