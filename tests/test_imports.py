"""The import graph of src/scalectl: no cycle, packages in the order of the data path (none
imports a package above it), and the trainer (rl/) independent of where runs are launched
(launch/) and stored (store/).

Every ``import`` and ``from ... import`` of a scalectl module counts, at module level or
inside a function alike, read with the standard library's ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "scalectl"

#: The packages from the bottom (imported by all) to the top (importing all): a module
#: imports only modules of its own layer or of layers below.  The bottom layer is the
#: shared vocabulary; ``cli`` loads the commands by name at run time.
LAYERS = [
    ("scalectl", "scalectl.errors", "scalectl.defaults", "scalectl.display", "scalectl.files",
     "scalectl.names", "scalectl.points"),
    ("scalectl.curve",),
    ("scalectl.presets",),
    ("scalectl.recipe",),
    ("scalectl.rl",),
    ("scalectl.store",),
    ("scalectl.job",),
    ("scalectl.launch",),
    ("scalectl.science",),
    ("scalectl.present",),
    ("scalectl.ablation",),
    ("scalectl.commands",),
    ("scalectl.cli",),
]

#: The trainer's stages in the order a batch meets them, bottom to top, likewise.
RL_STAGES = [
    ("scalectl.rl", "scalectl.rl.policy"),
    ("scalectl.rl.reward",),
    ("scalectl.rl.data",),
    ("scalectl.rl.rollout",),
    ("scalectl.rl.evaluation",),
    ("scalectl.rl.train",),
    ("scalectl.rl.batches",),
    ("scalectl.rl.transport",),
    ("scalectl.rl.schedule",),
    ("scalectl.rl.loop", "scalectl.rl.accounting", "scalectl.rl.checkpoint"),
    ("scalectl.rl.processes",),
    ("scalectl.rl.run",),
]

#: (importer prefix, imported prefix): edges that must not exist, whatever the layers.
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
    assert "scalectl.store.database" in edges["scalectl.job.body"]
    assert len(edges) > 60


def test_no_import_cycle():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()))


def test_rl_and_launch_stay_in_their_lanes():
    bad = [f"{a} imports {b}" for a, targets in graph().items() for b in targets
           for src, dst in FORBIDDEN if _under(a, src) and _under(b, dst)]
    assert bad == []


def layer_of(name: str, layers) -> int | None:
    """The index of the layer holding module ``name`` (its longest matching prefix), or None."""
    best, index = -1, None
    for i, layer in enumerate(layers):
        for prefix in layer:
            exact = name == prefix
            if (exact or (prefix != "scalectl" and _under(name, prefix))) and len(prefix) > best:
                best, index = len(prefix), i
    return index


def upward(edges: dict[str, set[str]], layers, within: str | None = None) -> list[str]:
    """The edges that go up the ``layers`` (of the modules under ``within``, if given)."""
    bad = []
    for a, targets in edges.items():
        if within and not _under(a, within):
            continue
        for b in targets:
            if within and not _under(b, within):
                continue
            la, lb = layer_of(a, layers), layer_of(b, layers)
            if la is not None and lb is not None and lb > la:
                bad.append(f"{a} (layer {la}) imports {b} (layer {lb})")
    return sorted(bad)


def test_every_module_has_a_layer():
    edges = graph()
    assert [m for m in edges if layer_of(m, LAYERS) is None] == []
    assert [m for m in edges if _under(m, "scalectl.rl") and layer_of(m, RL_STAGES) is None] == []


def test_packages_follow_the_data_path():
    edges = graph()
    assert upward(edges, LAYERS) == []
    assert upward(edges, RL_STAGES, within="scalectl.rl") == []


def test_the_layer_check_sees_an_upward_import():
    edges = {"scalectl.curve.fit": {"scalectl.store.database"}, "scalectl.store.database": {"scalectl.curve.fit"}}
    assert upward(edges, LAYERS) == ["scalectl.curve.fit (layer 1) imports scalectl.store.database (layer 5)"]
    rl = {"scalectl.rl.policy.model": {"scalectl.rl.loop"}}
    assert upward(rl, RL_STAGES, within="scalectl.rl") == [
        "scalectl.rl.policy.model (layer 0) imports scalectl.rl.loop (layer 9)"]


def test_no_folder_holds_too_many_modules():
    """~15 modules a folder at most (commands/: one module per command of `scalectl.cli.COMMANDS`,
    and what they share: common and bounds)."""
    from scalectl.cli import COMMAND_MODULES

    counts = {d: len([p for p in d.glob("*.py") if p.name != "__init__.py"]) for d in PACKAGE.rglob("*")
              if d.is_dir() and (d / "__init__.py").exists()}
    limits = {PACKAGE / "commands": len(COMMAND_MODULES) + 2}
    assert {str(d.relative_to(SRC)): n for d, n in counts.items() if n > limits.get(d, 15)} == {}


def test_the_long_function_lister_counts_from_def_to_last_line(tmp_path):
    """scripts/long_functions.py: a function's length is its def line to its last line (nested
    and methods named by their path), only those over the limit, longest first."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("long_functions", SRC.parent / "scripts" / "long_functions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    body = "\n".join(f"    x{i} = {i}" for i in range(8))
    (tmp_path / "m.py").write_text(f"def short():\n{body}\n\n\nclass K:\n    def long(self):\n"
                                   + "\n".join(f"        y{i} = {i}" for i in range(12)) + "\n")
    assert mod.long_functions(tmp_path, 9) == [(13, "m.py:13", "K.long")]
    assert mod.long_functions(tmp_path, 8) == [(13, "m.py:13", "K.long"), (9, "m.py:1", "short")]
