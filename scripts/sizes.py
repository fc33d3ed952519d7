"""List what breaks issue 45's size rule: source files over 400 lines, functions over 80 lines.

    python scripts/sizes.py            # core/, adapters/, models/, plugins/ (tests and generated files aside)
    python scripts/sizes.py --strict   # exit 1 when anything is listed

A function's length is its last line minus its first (decorators included), as ``ast`` reports.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOTS = ("core", "adapters", "models", "plugins")
MAX_FILE, MAX_FUNC = 400, 80


def _sources(root: Path):
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).parts
            if "tests" in parts or "assets" in parts or path.name.startswith("_generated"):
                continue
            yield path


def oversize(root: Path) -> list[str]:
    """One line per file over ``MAX_FILE`` lines and per function over ``MAX_FUNC`` lines."""
    found = []
    for path in _sources(root):
        text = path.read_text()
        rel = path.relative_to(root)
        lines = len(text.splitlines())
        if lines > MAX_FILE:
            found.append(f"{rel}: {lines} lines (at most {MAX_FILE})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > MAX_FUNC:
                    found.append(f"{rel}:{node.lineno}: {node.name}() {length} lines (at most {MAX_FUNC})")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when anything is over")
    args = parser.parse_args(argv)
    found = oversize(Path(__file__).resolve().parent.parent)
    print("\n".join(found) if found else "every file <= 400 lines, every function <= 80 lines")
    return 1 if (found and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
