"""The import graph of src/scalectl: no cycle, and the trainer (rl/) independent of where
runs are launched (launch/) and stored (store).

Every ``import`` and ``from ... import`` of a scalectl module counts, at module level or
inside a function alike, read with the standard library's ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "scalectl"

#: (importer prefix, imported prefix): edges that must not exist.
FORBIDDEN = [
    ("scalectl.rl", "scalectl.launch"),
    ("scalectl.rl", "scalectl.store"),
    ("scalectl.rl", "scalectl.job"),
    ("scalectl.rl", "scalectl.commands"),
    ("scalectl.launch", "scalectl.store"),
    ("scalectl.launch", "scalectl.rl"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The scalectl modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    out.add(f"{target}.{alias.name}")
                elif target in known:
                    out.add(target)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None; depth-first search."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(edges, WHITE)
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = GREY
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if m not in color:
                continue
            if color[m] == GREY:
                return stack[stack.index(m):] + [m]
            if color[m] == WHITE and (found := visit(m)):
                return found
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(edges):
        if color[n] == WHITE and (found := visit(n)):
            return found
    return None


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_walker_sees_cycles_and_package_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    edges = graph()
    assert "scalectl.rl.loop" in edges["scalectl.rl.run"]          # plain `from scalectl.rl.loop import ...`
    assert "scalectl.store" in edges["scalectl.job"]
    assert len(edges) > 60


def test_no_import_cycle():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()))


def test_rl_and_launch_stay_in_their_lanes():
    bad = [f"{a} imports {b}" for a, targets in graph().items() for b in targets
           for src, dst in FORBIDDEN if _under(a, src) and _under(b, dst)]
    assert bad == []
