"""Presets: the recipe, setup and ablation files shipped inside the package.

The package holds ``recipes/*.toml`` (the published recipes: grpo, dapo,
magistral, minimax, scalerl), ``setups/*.toml`` (tiny-cpu, paper-8b) and
``ablations/*.toml``, read with :mod:`importlib.resources`, so that an
installed scalectl runs ``scalectl run scalerl`` from any folder.  In a
checkout of the repository the top-level ``recipes/``, ``setups/`` and
``ablations/`` folders are links to these same files.

How a command argument names a file (:func:`resolve`):

1. an existing file path wins (``recipes/scalerl.toml``, ``./my.toml``);
2. otherwise a bare name (``scalerl``, or ``scalerl.toml``) is looked up as
   ``./<kind>/<name>.toml`` in the current folder (what ``scalectl init``
   copies there for editing), then among the packaged presets;
3. otherwise a :class:`~scalectl.errors.UserError` names the argument and
   the presets of that kind.
"""

from __future__ import annotations

import importlib.resources
import shutil
import tempfile
from pathlib import Path

from scalectl.errors import UserError

#: The kinds of preset, each a folder of TOML files.
KINDS = ("recipes", "setups", "ablations")
#: The setup ``scalectl run`` uses when none is given.
DEFAULT_SETUP = "tiny-cpu"
#: The base recipe of ``scalectl ablate --leave-one-out`` / ``--forward``.
DEFAULT_RECIPE = "scalerl"
#: Extra files ``scalectl init`` copies beside the presets (file name in the package -> name there).
EXTRA_FILES = {"datasette.json": "datasette.json"}

_extracted: Path | None = None


def root() -> Path:
    """The folder holding the packaged presets.

    A package installed as files (wheel, editable) is read in place; one
    imported from a zip archive is copied once to a temporary folder, so that
    ``extends`` and the ablation files' relative paths keep working.
    """
    global _extracted
    files = importlib.resources.files(__name__)
    if isinstance(files, Path):
        return files
    if _extracted is None:
        dest = Path(tempfile.mkdtemp(prefix="scalectl-presets-"))
        _copy_tree(files, dest)
        _extracted = dest
    return _extracted


def _copy_tree(src, dest: Path) -> None:
    for item in src.iterdir():
        if item.is_dir():
            (dest / item.name).mkdir(exist_ok=True)
            _copy_tree(item, dest / item.name)
        elif item.name.endswith((".toml", ".json")):
            (dest / item.name).write_bytes(item.read_bytes())


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"preset kind {kind!r} is not one of: {', '.join(KINDS)}")


def names(kind: str) -> list[str]:
    """The packaged presets of ``kind`` (``recipes``, ``setups``, ``ablations``), sorted."""
    _check_kind(kind)
    return sorted(p.stem for p in (root() / kind).glob("*.toml"))


def packaged(kind: str, name: str) -> Path:
    """The packaged file of preset ``name`` of ``kind``.

    Raises:
        UserError: no such preset (the message lists the presets of that kind).
    """
    _check_kind(kind)
    stem = name[:-5] if name.endswith(".toml") else name
    path = root() / kind / f"{stem}.toml"
    if not is_bare(name) or not path.is_file():
        raise UserError(f"{name!r} is not a {kind[:-1]} preset; {kind} presets: {', '.join(names(kind))}")
    return path


def is_bare(arg: str) -> bool:
    """Whether ``arg`` can be a preset name: no folder in it (``scalerl``, ``scalerl.toml``)."""
    return bool(arg) and "/" not in arg and "\\" not in arg and arg not in (".", "..")


def resolve(arg: str | Path, kind: str) -> Path:
    """The file a command argument names: an existing path, else a preset name
    (``./<kind>/<name>.toml`` first, then the packaged file).

    Args:
        arg: what the user typed (``recipes/scalerl.toml`` or ``scalerl``).
        kind: ``recipes``, ``setups`` or ``ablations``.

    Raises:
        UserError: neither a file nor a preset name; the message names the
            argument and lists the presets of ``kind``.
    """
    _check_kind(kind)
    path = Path(arg)
    text = str(arg)
    if path.is_file() or (not is_bare(text) and path.exists()):
        return path            # a folder or device given as a path: the reader says what it is
    if is_bare(text):
        stem = text[:-5] if text.endswith(".toml") else text
        local = Path(kind) / f"{stem}.toml"
        if local.is_file():
            return local
        candidate = root() / kind / f"{stem}.toml"
        if candidate.is_file():
            return candidate
    raise UserError(f"{arg}: no such file, and not the name of {'an' if kind[0] in 'aeiou' else 'a'} {kind[:-1]} preset "
                    f"({kind}: {', '.join(names(kind))})")


def find(name: str) -> Path | None:
    """The packaged preset called ``name`` of any kind (recipes first), or None;
    used for ``extends = "scalerl"`` in a file outside the presets' folders."""
    if not is_bare(name):
        return None
    stem = name[:-5] if name.endswith(".toml") else name
    for kind in KINDS[:2]:
        path = root() / kind / f"{stem}.toml"
        if path.is_file():
            return path
    return None


def description(path: Path) -> str:
    """The ``description`` key of a preset file ('' when it has none or does not parse)."""
    import tomllib

    try:
        value = tomllib.loads(Path(path).read_text()).get("description", "")
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    return value if isinstance(value, str) else ""


def copy_to(dest: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Copy every preset (``recipes/``, ``setups/``, ``ablations/``) and the
    Datasette metadata file into ``dest`` for editing; the copies keep their
    relative ``extends`` and ablation paths, so they work where they land.

    Args:
        dest: the folder (created if missing).
        overwrite: replace files that already exist there.

    Returns:
        The files written, in order.

    Raises:
        UserError: ``dest`` is a file, or (without ``overwrite``) some of the
            files already exist there: nothing is written then.
    """
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest}: exists and is not a folder")
    plan = [(root() / kind / f"{n}.toml", dest / kind / f"{n}.toml") for kind in KINDS for n in names(kind)]
    plan += [(root() / src, dest / target) for src, target in EXTRA_FILES.items() if (root() / src).is_file()]
    existing = [str(d) for _, d in plan if d.exists()]
    if existing and not overwrite:
        raise UserError(f"{dest}: would overwrite {', '.join(existing)} (use --force to replace them)")
    written = []
    for src, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        written.append(target)
    return written
