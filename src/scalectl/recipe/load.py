"""Loading recipe and setup files: TOML, ``extends`` inheritance, overrides, errors.

One loader for every command: :func:`load` reads a recipe file, a setup file
and ``--set key=value`` overrides, merges them (the recipe over the setup,
overrides over both: :mod:`scalectl.recipe.layers`), validates the result as a :class:`~scalectl.recipe.schema.Recipe` and
turns every pydantic error into a :class:`~scalectl.errors.UserError` that
names the file the key came from, the dotted key, the value and what is
allowed.

The loader reads only what a recipe can be: regular files of at most
:data:`MAX_FILE_BYTES` bytes of UTF-8 TOML, tables and arrays nested at most
:data:`MAX_DEPTH` deep, ``extends`` chains of at most :data:`MAX_EXTENDS`
files.  A device, a folder, a binary file or a pathologically nested one is
refused with the file named, never read until memory or stack run out.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scalectl import presets
from scalectl.errors import UserError
from scalectl.files import decode_utf8, read_limited
from scalectl.recipe.explain import unknown_key_hint
from scalectl.recipe.layers import Layer, Overridden
from scalectl.recipe.layers import overridden as find_overridden
from scalectl.recipe.loss_choices import companion_defaults
from scalectl.recipe.reward_function import function_problems
from scalectl.recipe.schema import Recipe

#: Where ``scalectl run`` finds the embedded default setup when none is given
#: (in the current folder; else next to the recipe; else the packaged preset).
DEFAULT_SETUP = f"setups/{presets.DEFAULT_SETUP}.toml"
#: Largest recipe or setup file, in bytes (the presets are under 3 kB).
MAX_FILE_BYTES = 1 << 20
#: Most files in one ``extends`` chain (the file itself included).
MAX_EXTENDS = 16
#: Deepest nesting of tables and arrays (the Recipe itself needs 4:
#: ``launcher.slurm.additional_parameters.KEY``).
MAX_DEPTH = 16

_KEY_PART = re.compile(r"[A-Za-z0-9_-]+")


def _depth(value: Any) -> int:
    """Nesting depth of tables and arrays, without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _parse_toml(text: str, where: str) -> dict:
    """Parse TOML text; ``where`` names its origin in the messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: invalid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{where}: nested more than {MAX_DEPTH} levels deep (arrays or tables)") from None
    if _depth(data) > MAX_DEPTH:
        raise UserError(f"{where}: nested more than {MAX_DEPTH} levels deep (arrays or tables)")
    return data


def read_toml(path: str | Path, what: str = "recipe or setup file") -> dict:
    """One TOML file (no ``extends``): a regular UTF-8 file of at most
    :data:`MAX_FILE_BYTES` bytes, nested at most :data:`MAX_DEPTH` deep.

    Raises:
        UserError: naming the file and what is wrong with it.
    """
    text = decode_utf8(path, read_limited(path, MAX_FILE_BYTES, what))
    return _parse_toml(text, str(path))


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """A nested recipe mapping as dotted keys: ``{"loss": {"type": "cispo"}}`` ->
    ``{"loss.type": "cispo"}`` (an empty table stays one key with value ``{}``)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


#: Tables that are one value, not sections: a layer that sets one replaces it whole (``--set
#: data.mix={}`` removes the setup's mixture, ``{7 = 0.2}`` replaces it).
VALUE_TABLES = frozenset({("data", "mix")})


def _merge(base: dict, top: dict, _path: tuple[str, ...] = ()) -> dict:
    """Deep merge: tables merge key by key (but :data:`VALUE_TABLES`, replaced whole), every
    other value in ``top`` wins."""
    out = dict(base)
    for key, value in top.items():
        path = (*_path, key)
        if isinstance(value, dict) and isinstance(out.get(key), dict) and path not in VALUE_TABLES:
            out[key] = _merge(out[key], value, path)
        else:
            out[key] = value
    return out


def read_layered(path: str | Path, _chain: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """Read a TOML file following its ``extends`` chain.

    Returns the merged table (without ``extends``) and the provenance of every
    dotted key: the file that set it last.

    Raises:
        UserError: missing file, not a regular file, too large, not UTF-8,
            invalid TOML (with line), nested too deep, a missing ``extends``
            target, an ``extends`` cycle or a chain longer than
            :data:`MAX_EXTENDS` files.
    """
    path = Path(path)
    resolved = path.resolve()
    if resolved in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, resolved))
        raise UserError(f"{path}: extends cycle: {cycle}")
    if len(_chain) >= MAX_EXTENDS:
        raise UserError(f"{path}: extends chain longer than {MAX_EXTENDS} files (from {_chain[0]})")
    data = read_toml(path)
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
    taken = _companions_of(merged, data, origin, str(path))
    merged = _merge(merged, data)
    origin.update({key: str(path) for key in flatten(data)})
    origin.update(taken)
    return merged, origin


def _companions_of(merged: dict, layer: dict, origin: dict[str, str], where: str) -> dict[str, str]:
    """Lay the new loss's companion defaults into ``layer`` when it changes ``loss.type``
    without setting them (:func:`scalectl.recipe.loss_choices.companion_defaults`); returns their
    provenance, e.g. {"loss.clip_high": "default of loss.type = 'ppo_clip' (set in X)"}."""
    before, own = merged.get("loss"), layer.get("loss")
    if not isinstance(own, dict) or not isinstance(before, dict):
        return {}
    stale = companion_defaults(own, before)
    for key, value in stale.items():
        own[key] = value
    return {f"loss.{key}": f"default of loss.type = {own['type']!r} (set in {where}; "
                           f"was {before.get(key)!r} from {origin.get(f'loss.{key}', 'the defaults')})"
            for key in stale if before.get(key) is not None}


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key.path=value``; the value is read as a TOML value when it can
    be (numbers, booleans, quoted strings, arrays), else taken as a bare string.

    Raises:
        UserError: no ``=``, an empty key or key part, a key part with other
            characters than letters, digits, ``_`` and ``-``, a key or value
            nested deeper than :data:`MAX_DEPTH`, or a value holding more than
            one TOML value (a newline and a second key).
    """
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY=VALUE, e.g. loss.type=cispo")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise UserError(f"--set {text!r}: empty key")
    parts = key.split(".")
    if not all(_KEY_PART.fullmatch(part) for part in parts):
        raise UserError(f"--set {_clip(text)}: key {_clip(key)} is not a dotted key "
                        "(parts of letters, digits, _ and -, e.g. optim.lr)")
    if len(parts) > MAX_DEPTH:
        raise UserError(f"--set {_clip(key)}: nested more than {MAX_DEPTH} levels deep")
    try:
        parsed = tomllib.loads(f"v = {raw.strip()}")
    except tomllib.TOMLDecodeError:
        return key, raw.strip()                      # not a TOML value: a bare string
    except RecursionError:
        parsed = None
    if parsed is None or _depth(parsed) > MAX_DEPTH:
        raise UserError(f"--set {key}: nested more than {MAX_DEPTH} levels deep (arrays or tables)")
    if set(parsed) != {"v"}:
        raise UserError(f"--set {key}: the value {_clip(raw)} holds more than one value")
    return key, parsed["v"]


def _clip(value: Any, width: int = 80) -> str:
    """``repr`` of a value, cut to ``width`` characters (a hostile value may be megabytes)."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 5] + "...'" + f" ({len(text):,} chars)"


def _shown(value: Any) -> str:
    """A value as it was written in TOML: true/false, inf, quoted strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    return _clip(value)


def _nest(dotted: str, value: Any) -> dict:
    out: dict = {}
    cur = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return out


def _printable(part: str) -> str:
    """A key as the error shows it: as written, or with its unprintable characters escaped
    (``hidden\\u2066_size``), so that a hostile key cannot reorder or hide the message."""
    return part if part.isprintable() else part.encode("unicode_escape").decode("ascii")


def _describe(err: dict, data: dict) -> str:
    """One pydantic error as 'key = value: what is allowed'."""
    loc = [_printable(str(p)) for p in err["loc"]]
    # pydantic reports model-level validator failures at the section itself
    key = ".".join(loc)
    kind = err["type"]
    value = err.get("input")
    shown = _shown(value)
    if kind == "extra_forbidden":
        return f"{key}: unknown key" + unknown_key_hint(tuple(loc[:-1]), loc[-1])
    if kind == "literal_error":
        allowed = err["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        return f"{key} = {shown} is not one of: {allowed}"
    if kind == "value_error":
        msg = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
        # a section's validator whose message names its own key ("async.schedule = ...") is not prefixed
        return f"{key}: {msg}" if key and not msg.startswith(key + ".") else msg
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}[kind]
        bound = next(iter(err["ctx"].values()))
        return f"{key} = {shown} is out of range: must be {op} {bound}"
    if kind == "missing":
        return f"{key}: required key is missing"
    wanted = _WANTED.get(kind)
    if wanted is not None:
        return f"{key} = {shown}: {wanted}"
    if kind in ("string_too_long", "too_long"):
        return f"{key} = {shown}: longer than {err['ctx']['max_length']:,} " + \
            ("characters" if kind == "string_too_long" else "entries")
    return f"{key} = {shown}: {err['msg']}"


#: What a value of the wrong type should have been (strict types: no "yes" for true,
#: no true for 1, no 1.5 for an integer).
_WANTED = {
    "int_type": "must be an integer (a whole number without a decimal point)",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string (in quotes)",
    "finite_number": "must be a finite number",
    "model_type": "must be a table",
    "dict_type": "must be a table",
}


def _error_file(loc: tuple, origin: dict[str, str], fallback: str) -> str:
    dotted = ".".join(str(p) for p in loc)
    best = None
    for key, src in origin.items():
        if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + "."):
            best = src
            if key == dotted:
                break
    return best or fallback


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\.\"' ]+?)\s*=")


def key_line(path: str, dotted: str) -> int | None:
    """The 1-based line of ``path`` (a TOML file) where the dotted key ``dotted`` is set, or
    None (not a readable file, or the key not found as ``key = ...`` under its table header:
    e.g. inside an inline table).  A section's line is its ``[header]``.  tomllib gives no positions; this reads the text."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            table = header.group(1).replace(" ", "").replace('"', "").replace("'", "")
            if table == dotted:
                return number                   # a section: its header
            continue
        key = _KEY.match(line)
        if key:
            name = key.group(1).replace(" ", "").replace('"', "").replace("'", "")
            if (f"{table}.{name}" if table else name) == dotted:
                return number
    return None


def _at_line(where: str, loc: tuple) -> str:
    """`` (line N)`` when ``where`` is a file that sets the key ``loc`` on line N, else ``""``."""
    for cut in range(len(loc), 0, -1):          # the key, or the nearest key above it set in the file
        line = key_line(where, ".".join(str(p) for p in loc[:cut]))
        if line is not None:
            return f" (line {line})"
    return ""


def validate(data: dict, origin: dict[str, str], label: str) -> Recipe:
    """Validate merged recipe data; every error names its file and dotted key, and the line
    of the file that sets the key when it can be found (:func:`key_line`).

    Raises:
        UserError: with one line per problem.
    """
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            where = _error_file(e["loc"], origin, label)
            first, *rest = _describe(e, data).split("\n")    # the line number ends the first line,
            at = _at_line(where, e["loc"])                    # before the colon that opens a list
            first = f"{first[:-1]}{at}:" if first.endswith(":") else first + at
            lines.append("\n".join([f"{where}: {first}", *rest]))
        raise UserError("\n".join(lines)) from None


def load(
    recipe: str | Path,
    setup: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    check_files: bool = False,
    notes: list[str] | None = None,
    origins: dict[str, str] | None = None,
    overridden: list[Overridden] | None = None,
) -> Recipe:
    """Load, merge and validate a recipe with a setup and ``--set`` overrides.

    The layers merge in the order of :mod:`scalectl.recipe.layers`: schema defaults <
    setup < the recipe file (with its ``extends`` chain) < ``--set``.  A key the recipe file
    sets wins over the setup's; the setup gives what the recipe leaves unset.

    Args:
        recipe: path of the recipe TOML (how to train), or a preset name
            (``scalerl``; :func:`scalectl.presets.resolve`).
        setup: path of the setup TOML (where and how big) or a preset name
            (``tiny-cpu``); ``None`` for the recipe alone (e.g. ``scalectl validate``).
        overrides: ``key=value`` strings, applied last.
        check_files: also check what ``model.path`` and ``data.source`` name
            on this machine, without loading them (:func:`check_sources`).
        notes: when given, a line is appended for each companion of ``loss.type``
            that a change of loss type reset to the new loss's default.
        origins: when given, filled with where each dotted key was set last: a file's
            path, ``--set KEY``, or ``default of loss.type = ...`` for a companion a change
            of loss type reset (keys set nowhere are absent).
        overridden: when given, filled with each key whose value replaced another layer's
            explicit, different value (:class:`~scalectl.recipe.layers.Overridden`; its
            ``str`` is the line ``validate`` and ``run`` print).

    Returns:
        The frozen :class:`Recipe`; its ``name`` defaults to the recipe file's stem.

    Raises:
        UserError: any problem, naming file, key, value and what is allowed.
    """
    recipe = presets.resolve(recipe, "recipes")
    data, origin, layers = _over_setup(recipe, setup)
    data.setdefault("name", Path(recipe).stem)
    layer: dict = {}
    set_origin: dict[str, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        layer = _merge(layer, _nest(key, value))
        set_origin[key] = f"--set {key}"
    origin.update(set_origin)
    taken = _companions_of(data, layer, origin, "--set loss.type")
    layers.append(Layer(flatten(layer), {**set_origin, **taken}, "--set"))
    data = _merge(data, layer)
    origin.update(taken)
    if notes is not None:
        notes.extend(f"{key} = {data['loss'][key.split('.', 1)[1]]!r}: {why}"
                     for key, why in origin.items() if why.startswith("default of loss.type"))
    result = validate(data, origin, str(recipe))
    if origins is not None:
        origins.update(origin)
    if overridden is not None:
        overridden.extend(find_overridden(layers))
    if check_files:
        problems = check_sources(result)
        if problems:
            raise UserError("\n".join(f"{_error_file(tuple(key.split('.')), origin, str(recipe))}: {msg}"
                                       for key, msg in problems))
    return result


def _over_setup(recipe: Path, setup: str | Path | None) -> tuple[dict, dict[str, str], list[Layer]]:
    """The recipe file (with its ``extends`` chain) laid over the setup: the merged table, the
    origin of each key, and the two layers (:mod:`scalectl.recipe.layers`).  A recipe that
    changes the setup's ``loss.type`` gives the new loss's companions their defaults."""
    data, origin = read_layered(recipe)
    if setup is None:
        return data, origin, [Layer(flatten(data), origin, str(recipe))]
    setup = presets.resolve(setup, "setups")
    sdata, sorigin = read_layered(setup)
    sdata.pop("name", None)
    sdata.pop("description", None)
    origin.update(_companions_of(sdata, data, sorigin, str(recipe)))
    layers = [Layer(flatten(sdata), sorigin, str(setup)), Layer(flatten(data), origin, str(recipe))]
    return _merge(sdata, data), {**sorigin, **origin}, layers


#: ``data.source`` files by suffix (scalectl.rl.data.files reads these).
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
SYNTHETIC_SOURCES = ("synthetic:arithmetic",)
BUILTIN_MODELS = ("builtin:tiny",)


def check_sources(recipe: Recipe) -> list[tuple[str, str]]:
    """Check ``model.path`` and ``data.source`` as far as can be done without loading them,
    and import the reward function.

    * ``model.path``: ``builtin:tiny`` (which warm-starts on
      ``synthetic:arithmetic`` only), a checkpoint folder holding
      ``config.json`` (transformers ``save_pretrained`` layout), or a simulated
      curve ``simulated:KEY=VALUE,...`` (:mod:`scalectl.curve.simulated`).
    * ``data.source``: ``synthetic:arithmetic``; ``hf:NAME`` with a name (a
      hub name cannot be checked offline; a local folder ``hf:./x`` or
      ``hf:/x`` must exist); or a regular ``.jsonl``/``.json``/``.parquet`` file.
    * ``reward``: the function imports here and fits the recipe
      (:func:`scalectl.recipe.reward_function.function_problems`).

    Relative paths are taken from the current folder, as the trainer takes them.

    Returns:
        ``(dotted key, message)`` for each problem; empty when all is well.
    """
    problems: list[tuple[str, str]] = []
    model, source = recipe.model.path, recipe.data.source
    if model.startswith("simulated:"):          # a simulated curve (scalectl.curve.simulated), no model
        from scalectl.curve.simulated import parse_spec

        try:
            parse_spec(model)
        except UserError as exc:
            problems.append(("model.path", str(exc)))
    elif model.startswith("builtin:"):
        if model not in BUILTIN_MODELS:
            problems.append(("model.path", f"model.path = {model!r} is not one of: "
                             f"{', '.join(BUILTIN_MODELS)}, a checkpoint folder"))
        elif source not in SYNTHETIC_SOURCES:
            problems.append(("model.path", builtin_with_data(recipe)))
    else:
        folder = Path(model).expanduser()
        if not folder.is_dir():
            problems.append(("model.path", f"model.path = {model!r}: no such folder"))
        elif not (folder / "config.json").is_file():
            problems.append(("model.path", f"model.path = {model!r}: not a checkpoint folder "
                             "(no config.json; save_pretrained layout expected)"))
    allowed = "synthetic:arithmetic, hf:NAME, a .jsonl/.json/.parquet file"
    if source.startswith("synthetic:"):
        if source not in SYNTHETIC_SOURCES:
            problems.append(("data.source", f"data.source = {source!r} is not one of: {allowed}"))
    elif source.startswith("hf:"):
        name = source[3:]
        if not name.strip():
            problems.append(("data.source", f"data.source = {source!r}: a dataset name must follow hf:"))
        elif name.startswith((".", "/", "~")) and not Path(name).expanduser().exists():
            problems.append(("data.source", f"data.source = {source!r}: no such local dataset {name}"))
    elif Path(source).suffix.lower() not in DATA_SUFFIXES:
        problems.append(("data.source", f"data.source = {source!r} is not one of: {allowed}"))
    elif not Path(source).expanduser().is_file():
        problems.append(("data.source", f"data.source = {source!r}: no such file"))
    problems += function_problems(recipe.reward.function, recipe.reward.format, think_tags=recipe.model.think_tags,
                                  model_path=model, convention=recipe.reward.convention)      # the reward function imports here, and fits the model
    return problems


#: Where the docs say how to train and evaluate on prompts of one's own.
OWN_MODEL_DOCS = 'docs/real-data.md, "Your own model"'


def builtin_with_data(recipe: Recipe) -> str:
    """Why ``builtin:tiny`` does not take ``recipe``'s prompt set, and what to do instead: a small
    real checkpoint, and the length keys to raise for real prompts and answers."""
    ln = recipe.length
    return (f"model.path = {recipe.model.path!r} is warm-started on data.source = 'synthetic:arithmetic' only, "
            f"not {recipe.data.source!r}: it answers nothing else. For prompts of your own (on a CPU too), give "
            "model.path a small real checkpoint folder (save_pretrained layout with its tokenizer: a model of "
            "0.5B parameters or less, e.g. Qwen2.5-0.5B-Instruct, runs on a CPU), and raise the lengths to fit "
            f"your prompts and answers: length.max_prompt_tokens = {ln.max_prompt_tokens} now (longer prompts "
            "are dropped; `scalectl validate --setup ...` counts them) and length.max_new_tokens = "
            f"{ln.max_new_tokens} (with length.interrupt_min/interrupt_max below it); see {OWN_MODEL_DOCS}")


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


#: What ``run --resume RUN --set KEY=VALUE`` may change to extend a run: its budget.
BUDGET_KEYS = ("budget.steps", "budget.gpu_hours", "budget.no_signal_steps")
#: What ``run --resume RUN --set KEY=VALUE`` may change to run the job elsewhere (off a node that
#: died, onto another partition): keys that say only where the job runs, never what it trains or
#: measures, nor the job's shape (nodes, tasks, GPUs, CPUs, memory, time limit).  The ``launcher``
#: section is out of the content hash (:data:`scalectl.recipe.schema.UNHASHED_KEYS`), so the run
#: keeps its hash, and so its place among the seeds of its recipe.  Not here: account and qos (who
#: pays, what priority), and every other sbatch option of ``additional_parameters``.
PLACEMENT_KEYS = ("launcher.slurm.generator_nodelist", "launcher.slurm.trainer_nodelist",
                  "launcher.slurm.partition", "launcher.slurm.additional_parameters.nodelist",
                  "launcher.slurm.additional_parameters.exclude")
#: Every key ``run --resume`` may change.
RESUME_KEYS = BUDGET_KEYS + PLACEMENT_KEYS


#: What ``evaluate --set KEY=VALUE`` may change: how prompts are read, filtered and scored and how
#: completions are sampled, never the model or its weights (keys of these sections, and these keys).
EVALUATE_SECTIONS = ("length", "eval", "reward")
#: Keys of ``data`` that ``evaluate --set`` may change: how the columns of a ``--data`` set are read.
EVALUATE_DATA_KEYS = ("data.prompt_key", "data.answer_key", "data.split", "data.subset")


def evaluated_recipe(recipe: Recipe, overrides: list[str] | tuple[str, ...]) -> tuple[Recipe, dict[str, Any]]:
    """``recipe`` (a stored run's) with the ``--set`` overrides given to ``scalectl evaluate``,
    parsed as ``run`` parses them (:func:`parse_override`).

    Returns:
        (the recipe, the ``data`` keys set: name -> value, for a ``--data`` set).

    Raises:
        UserError: a key outside :data:`EVALUATE_SECTIONS` and :data:`EVALUATE_DATA_KEYS` (naming
            them), or a value the Recipe refuses.
    """
    data, origin, data_keys = recipe.to_dict(), {}, {}
    for text in overrides:
        key, value = parse_override(text)
        if key.split(".")[0] not in EVALUATE_SECTIONS and key not in EVALUATE_DATA_KEYS:
            raise UserError(f"--set {key}: evaluate keeps the run's model and weights; only the keys of "
                            f"{', '.join(s + '.*' for s in EVALUATE_SECTIONS)} and {', '.join(EVALUATE_DATA_KEYS)} "
                            "may change")
        if key in EVALUATE_DATA_KEYS:
            data_keys[key.split(".", 1)[1]] = value
        data = _merge(data, _nest(key, value))
        origin[key] = f"--set {key}"
    return validate(data, origin, "the run's recipe"), data_keys


def resumed_recipe(recipe: Recipe, overrides: list[str] | tuple[str, ...]) -> Recipe:
    """``recipe`` (a stored run's) with the ``--set`` overrides given to ``run --resume``.

    A resumed run keeps what it trains; only :data:`BUDGET_KEYS` (to extend it) and
    :data:`PLACEMENT_KEYS` (to run its job elsewhere) may change.

    Raises:
        UserError: another key, or a value the Recipe refuses.
    """
    data, origin = recipe.to_dict(), {}
    for text in overrides:
        key, value = parse_override(text)
        if key not in RESUME_KEYS:
            raise UserError(f"--set {key}: a resumed run keeps its recipe; only {', '.join(BUDGET_KEYS)} "
                            f"(to extend the run) and {', '.join(PLACEMENT_KEYS)} (to run its job elsewhere) "
                            "may change")
        data = _merge(data, _nest(key, value))
        origin[key] = f"--set {key}"
    return validate(data, origin, "the run's recipe")
