"""Loading recipe and setup files: TOML, ``extends`` inheritance, overrides, errors.

One loader for every command: :func:`load` reads a recipe file, a setup file
and ``--set key=value`` overrides, merges them (setup over recipe, overrides
over both), validates the result as a :class:`~scalectl.recipe.Recipe` and
turns every pydantic error into a :class:`~scalectl.errors.UserError` that
names the file the key came from, the dotted key, the value and what is
allowed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scalectl import presets
from scalectl.errors import UserError
from scalectl.recipe import Recipe

#: Where ``scalectl run`` finds the embedded default setup when none is given
#: (in the current folder; else next to the recipe; else the packaged preset).
DEFAULT_SETUP = f"setups/{presets.DEFAULT_SETUP}.toml"


def _read_toml(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: invalid TOML: {exc}") from None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: tables merge key by key, every other value in ``top`` wins."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_layered(path: str | Path, _chain: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """Read a TOML file following its ``extends`` chain.

    Returns the merged table (without ``extends``) and the provenance of every
    dotted key: the file that set it last.

    Raises:
        UserError: missing file, invalid TOML (with line), a missing
            ``extends`` target or an ``extends`` cycle.
    """
    path = Path(path)
    resolved = path.resolve()
    if resolved in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, resolved))
        raise UserError(f"{path}: extends cycle: {cycle}")
    data = _read_toml(path)
    parent = data.pop("extends", None)
    merged: dict = {}
    origin: dict[str, str] = {}
    if parent is not None:
        if not isinstance(parent, str):
            raise UserError(f"{path}: extends = {parent!r} must be a path (string)")
        parent_path = path.parent / parent
        if not parent_path.exists() and presets.find(parent) is not None:
            parent_path = presets.find(parent)     # extends = "scalerl": the packaged preset
        if not parent_path.exists():
            raise UserError(f"{path}: extends = {parent!r}: no such file {parent_path}")
        merged, origin = read_layered(parent_path, (*_chain, resolved))
    merged = _merge(merged, data)
    origin.update({key: str(path) for key in _flatten(data)})
    return merged, origin


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key.path=value``; the value is read as a TOML value when it can
    be (numbers, booleans, quoted strings, arrays), else taken as a bare string.

    Raises:
        UserError: no ``=`` or an empty key.
    """
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY=VALUE, e.g. loss.type=cispo")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise UserError(f"--set {text!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def _nest(dotted: str, value: Any) -> dict:
    out: dict = {}
    cur = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return out


def _describe(err: dict, data: dict) -> str:
    """One pydantic error as 'key = value: what is allowed'."""
    loc = [str(p) for p in err["loc"]]
    # pydantic reports model-level validator failures at the section itself
    key = ".".join(loc)
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(err["loc"][:-1])
        return f"{key}: unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    if kind == "literal_error":
        allowed = err["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        return f"{key} = {value!r} is not one of: {allowed}"
    if kind == "value_error":
        msg = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
        return f"{key}: {msg}" if key else msg
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}[kind]
        bound = next(iter(err["ctx"].values()))
        return f"{key} = {value!r} is out of range: must be {op} {bound}"
    if kind == "missing":
        return f"{key}: required key is missing"
    return f"{key} = {value!r}: {err['msg']}"


def _allowed_keys(section: tuple) -> list[str]:
    """The keys a (nested) section of the Recipe accepts, by their TOML names."""
    model = Recipe
    for part in section:
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = getattr(field, "annotation", None) if field else None
        if not isinstance(model, type) or not hasattr(model, "model_fields"):
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _error_file(loc: tuple, origin: dict[str, str], fallback: str) -> str:
    dotted = ".".join(str(p) for p in loc)
    best = None
    for key, src in origin.items():
        if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + "."):
            best = src
            if key == dotted:
                break
    return best or fallback


def validate(data: dict, origin: dict[str, str], label: str) -> Recipe:
    """Validate merged recipe data; every error names its file and dotted key.

    Raises:
        UserError: with one line per problem.
    """
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        lines = [f"{_error_file(e['loc'], origin, label)}: {_describe(e, data)}" for e in exc.errors()]
        raise UserError("\n".join(lines)) from None


def load(
    recipe: str | Path,
    setup: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> Recipe:
    """Load, merge and validate a recipe with a setup and ``--set`` overrides.

    Args:
        recipe: path of the recipe TOML (how to train), or a preset name
            (``scalerl``; :func:`scalectl.presets.resolve`).
        setup: path of the setup TOML (where and how big) or a preset name
            (``tiny-cpu``); ``None`` for the recipe alone (e.g. ``scalectl validate``).
        overrides: ``key=value`` strings, applied last.

    Returns:
        The frozen :class:`Recipe`; its ``name`` defaults to the recipe file's stem.

    Raises:
        UserError: any problem, naming file, key, value and what is allowed.
    """
    recipe = presets.resolve(recipe, "recipes")
    data, origin = read_layered(recipe)
    data.setdefault("name", Path(recipe).stem)
    if setup is not None:
        sdata, sorigin = read_layered(presets.resolve(setup, "setups"))
        sdata.pop("name", None)
        sdata.pop("description", None)
        data = _merge(data, sdata)
        origin.update(sorigin)
    for text in overrides:
        key, value = parse_override(text)
        data = _merge(data, _nest(key, value))
        origin[key] = f"--set {key}"
    return validate(data, origin, str(recipe))


def find_default_setup(recipe: str | Path) -> Path:
    """The embedded default setup: ``setups/tiny-cpu.toml`` in the current
    folder, else next to the recipe's folder, else the packaged preset
    (so ``scalectl run scalerl`` works from any folder)."""
    candidates = [Path(DEFAULT_SETUP)]
    if Path(recipe).is_file():
        candidates.append(Path(recipe).resolve().parent.parent / DEFAULT_SETUP)
    for path in candidates:
        if path.is_file():
            return path
    return presets.packaged("setups", presets.DEFAULT_SETUP)
