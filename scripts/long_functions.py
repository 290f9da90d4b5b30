"""List the functions of src/ longer than a limit (the project's rule: no function over ~80 lines).

    python scripts/long_functions.py [--limit 80] [FOLDER]

A function's length is ``end_lineno - lineno + 1`` of its ``ast`` node: from its ``def``
(decorators left out) to its last line, docstring and nested functions included.  Methods
are named ``Class.method``, nested functions ``outer.inner``.  Prints one line per function
over the limit, longest first: its length, file:line and name.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def long_functions(folder: Path, limit: int) -> list[tuple[int, str, str]]:
    """(lines, "file:line", qualified name) of every function under ``folder`` over ``limit`` lines."""
    rows: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = child.end_lineno - child.lineno + 1
                if n > limit:
                    rows.append((n, f"{path.relative_to(folder)}:{child.lineno}", prefix + child.name))
                visit(child, path, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for path in sorted(folder.rglob("*.py")):
        visit(ast.parse(path.read_text(), str(path)), path, "")
    return sorted(rows, key=lambda r: (-r[0], r[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(ROOT / "src"))
    ap.add_argument("--limit", type=int, default=80)
    args = ap.parse_args()
    for n, where, name in long_functions(Path(args.folder), args.limit):
        print(f"{n:4d}  {where:48s} {name}")


if __name__ == "__main__":
    main()
