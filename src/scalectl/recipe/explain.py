"""What every recipe key means, read from where it is declared.

Each field of :class:`~scalectl.recipe.schema.Recipe` and its sections carries a
``description`` (meaning, unit, source); its type, allowed values, bounds and default
are the declaration's own.  This module reads them for ``scalectl validate --explain
KEY`` (:func:`key_doc`, :func:`explain_lines`) and for the unknown-key error of
:mod:`scalectl.recipe.load` (:func:`unknown_key_hint`), so the text a user reads is
never a copy kept in step by hand.  Allowed values of ``loss.type`` and
``launcher.type`` are described by the tables they come from
(:mod:`~scalectl.recipe.loss_choices`, :mod:`~scalectl.recipe.launcher_choices`).

Pure functions of the schema: no torch, no file reading.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo

from scalectl import presets
from scalectl.errors import UserError
from scalectl.recipe.launcher_choices import LAUNCHER_CHOICES
from scalectl.recipe.loss_choices import COMPANIONS, LOSS_CHOICES
from scalectl.recipe.schema import Recipe


@dataclass(frozen=True)
class KeyDoc:
    """What one recipe key is: ``key`` dotted as in TOML (``loss.clip_high``; ``""`` is the
    recipe itself), ``kind`` its type in words (``section`` for a table of keys), its
    ``description``, ``bounds`` (``> 0``, ``at most 4 entries``), ``allowed`` values with
    their notes, whether it is ``optional`` (may be left unset), ``default`` as TOML text
    (``unset`` for none; empty for a section),
    ``default_note`` when the default depends on other keys, and a section's ``keys``."""

    key: str
    kind: str
    description: str
    default: str = ""
    default_note: str = ""
    bounds: tuple[str, ...] = ()
    allowed: tuple[tuple[str, str], ...] = ()
    optional: bool = False
    keys: tuple["KeyDoc", ...] = ()

    @property
    def name(self) -> str:
        """The last part of the key (``clip_high``)."""
        return self.key.rsplit(".", 1)[-1]

    @property
    def summary(self) -> str:
        """The description's first sentence without its closing citation: the line of a list
        (the type, for a key not described)."""
        return summary(self.description) or self.type_text

    @property
    def type_text(self) -> str:
        """Kind and bounds in a few words: ``number > 0, <= 100, or unset``."""
        bounds = ", ".join(self.bounds)
        text = self.kind + ((" " if bounds[:1] in "<>" else "; ") + bounds if bounds else "")
        return text + (", or unset" if self.optional else "")

    def to_dict(self) -> dict:
        """Plain JSON-able data (``--json``)."""
        out = {"key": self.key, "kind": self.kind, "description": self.description}
        if self.kind == "section":
            out["keys"] = [k.to_dict() for k in self.keys]
            return out
        return {**out, "bounds": list(self.bounds), "optional": self.optional, "default": self.default,
                "default_note": self.default_note, "allowed": [{"value": v, "note": n} for v, n in self.allowed]}


_DOTTED = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_CITED = re.compile(r"\s*\([^()]*(arXiv|docs/|README)[^()]*\)\.$")
_NOT_ENDS = ("e.g", "i.e", "et al", "Sec", "App", "Eq", "vs", "cf")


def summary(text: str) -> str:
    """The first sentence of ``text`` (not cut at ``e.g.``, ``Sec.`` and the like), without a
    closing parenthesis that only cites a source."""
    first = text
    for m in re.finditer(r"\.(\s|$)", text):
        if not text[:m.start()].endswith(_NOT_ENDS):
            first = text[:m.start() + 1]
            break
    short = _CITED.sub(".", first)
    return short if len(short) > 1 else first


# --------------------------------------------------------------------------- the schema's fields


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A section's fields by their TOML names (``async``, not ``async_``)."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _optional(annotation: Any) -> bool:
    """Whether the annotation takes ``None`` (the key may be left unset)."""
    return get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in get_args(annotation)


def _unwrap(annotation: Any) -> tuple[Any, list]:
    """(the annotation without ``None`` and ``Annotated``, the Annotated metadata)."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    meta: list = []
    if get_origin(annotation) is typing.Annotated:
        annotation, *meta = get_args(annotation)
    for m in list(meta):
        if isinstance(m, FieldInfo):
            meta.extend(m.metadata)
    return annotation, meta


def _section_model(info: FieldInfo) -> type[BaseModel] | None:
    base = _unwrap(info.annotation)[0]
    return base if isinstance(base, type) and issubclass(base, BaseModel) else None


def _kind(annotation: Any) -> str:
    """A type in words: ``number``, ``integer``, ``one of: a, b``, ``list of ...``."""
    base = _unwrap(annotation)[0]
    origin = get_origin(base)
    if origin is Literal:
        return "one of: " + ", ".join(str(v) for v in get_args(base))
    if origin is list:
        return f"list, each {_kind(get_args(base)[0])}"
    if origin is dict:
        return "table of strings"
    if isinstance(base, type) and issubclass(base, BaseModel):
        return "section"
    return {bool: "true or false", int: "integer", float: "number", str: "string"}.get(base, str(base))


def _num(value: float | int) -> str:
    """A bound for people: 4,294,967,295; 1e-15; 0.28."""
    if isinstance(value, int):
        return f"{value:,}"
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m[1] == "-" else "") + m[2], f"{value:g}")


def _bounds(info: FieldInfo) -> tuple[str, ...]:
    """Bounds in words, the tightest length of each kind (``Line`` within ``max_length=100``)."""
    base, meta = _unwrap(info.annotation)
    metadata = [*info.metadata, *meta]
    # pydantic keeps each bound as an annotated-types object with one attribute (Gt.gt, MaxLen.max_length)
    out = [f"{op} {_num(getattr(m, attr))}" for m in metadata
           for attr, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if getattr(m, attr, None) is not None]
    unit = "characters" if base is str else "entries"
    shortest = max((m.min_length for m in metadata if getattr(m, "min_length", None)), default=0)
    longest = min((m.max_length for m in metadata if getattr(m, "max_length", None) is not None), default=None)
    out += [f"at least {shortest:,} {unit if shortest > 1 else unit[:-1]}"] if shortest else []
    out += [f"at most {longest:,} {unit}"] if longest is not None else []
    if any(isinstance(m, AfterValidator) and m.func.__name__ == "_one_line" for m in metadata):
        out.append("one line")
    return tuple(out)


def toml_text(value: Any) -> str:
    """A value as one writes it in TOML (``unset`` for None): ``"cispo"``, ``5.0``, ``true``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        text = f"{value:g}" if float(f"{value:g}") == value else repr(value)
        return text if any(c in text for c in ".ein") else text + ".0"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_text(v)}" for k, v in value.items()) + "}"
    return str(value)


#: What each allowed value of a key is, from the table that defines the values.
VALUE_NOTES: dict[str, dict[str, str]] = {
    "loss.type": {name: f"clip_low {toml_text(c.clip_low)}, clip_high {toml_text(c.clip_high)}, "
                        f"{c.ratio_level}-level ratio: {c.source}" for name, c in LOSS_CHOICES.items()},
    "launcher.type": dict(LAUNCHER_CHOICES),
}



@functools.cache
def _empty_recipe() -> dict:
    return Recipe().to_dict()


def _recipe_default(parts: tuple[str, ...]) -> Any:
    """The value at ``parts`` of a recipe that sets nothing (``Recipe()``), as in its TOML."""
    return value_at(_empty_recipe(), ".".join(parts))


def _default_note(parts: tuple[str, ...], default: Any) -> str:
    if parts[:1] == ("loss",) and len(parts) == 2 and parts[1] in COMPANIONS:
        per_loss = ", ".join(f"{name} {toml_text(c.companions[parts[1]])}" for name, c in LOSS_CHOICES.items())
        return f"taken from loss.type: {per_loss}"
    if len(parts) > 1:
        empty = _recipe_default(parts)
        if empty != default:
            return f"{toml_text(empty)} when the recipe has no [{'.'.join(parts[:-1])}] table"
    return ""


def _doc(parts: tuple[str, ...], info: FieldInfo | None) -> KeyDoc:
    key = ".".join(parts)
    model = Recipe if info is None else _section_model(info)
    description = Recipe.__doc__.split("\n\n")[0] if info is None else (info.description or "")
    if model is not None:
        keys = tuple(_doc((*parts, name), sub) for name, sub in _fields(model).items())
        return KeyDoc(key, "section", description, keys=keys)
    default = info.get_default(call_default_factory=True)
    allowed: tuple[tuple[str, str], ...] = ()
    base = _unwrap(info.annotation)[0]
    if get_origin(base) is Literal:
        notes = VALUE_NOTES.get(key, {})
        allowed = tuple((str(v), notes.get(v, "")) for v in get_args(base))
    return KeyDoc(key, _kind(info.annotation), description, toml_text(default), _default_note(parts, default),
                  _bounds(info), allowed, _optional(info.annotation))


def key_doc(key: str) -> KeyDoc:
    """The documentation of a dotted recipe key (``loss.clip_high``) or section (``loss``,
    ``launcher.slurm``); ``""`` is the whole recipe.

    Raises:
        UserError: an unknown key, naming the section's keys (:func:`unknown_key_hint`), or
            text that is no dotted key.
    """
    key = key.strip()
    if key and (len(key) > 200 or not _DOTTED.fullmatch(key)):
        shown = repr(key) if len(key) <= 80 else repr(key[:70]) + f"... ({len(key):,} chars)"
        raise UserError(f"{shown} is not a dotted key (parts of letters, digits, _ and -, e.g. loss.clip_high)")
    parts = tuple(key.split(".")) if key else ()
    model, info = Recipe, None
    for i, part in enumerate(parts):
        if model is None:
            raise UserError(f"{key}: unknown key: {'.'.join(parts[:i])} is a value "
                            f"({_kind(info.annotation)}), not a section")
        fields = _fields(model)
        if part not in fields:
            raise UserError(f"{key}: unknown key" + unknown_key_hint(parts[:i], part))
        info = fields[part]
        model = _section_model(info)
    return _doc(parts, info)


def unknown_key_hint(section: tuple[str, ...], name: str) -> str:
    """What follows "KEY: unknown key": the closest key of the section when one is close
    (difflib), then the section's keys, one line each with its summary.

    ``section``: the dotted path of the section the key was given in (``("loss",)``; ``()``
    for the top level); a path that is no section gives ``""``.
    """
    try:
        doc = key_doc(".".join(section))
    except UserError:
        return ""
    if doc.kind != "section":
        return ""
    names = [k.name for k in doc.keys]
    close = difflib.get_close_matches(name, names, n=1)
    where = f"[{doc.key}]" if doc.key else "a recipe"
    hint = f"; did you mean {'.'.join((*section, close[0]))}?" if close else "."
    return f"{hint} The keys of {where}:\n" + "\n".join(key_lines(doc, detail=False))


# --------------------------------------------------------------------------- rendering


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]).rstrip() for r in rows]


def _cut(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[:width - 4] + '..."'


def key_lines(doc: KeyDoc, detail: bool = True) -> list[str]:
    """One line per key of a section: name and summary; ``detail`` adds type, bounds and default."""
    if detail:
        rows = [(k.name, k.type_text, f"default {_cut(k.default)}" if k.kind != "section" else "",
                 summary(k.description)) for k in doc.keys]
    else:
        rows = [(k.name, k.summary) for k in doc.keys]
    return _table(rows)


def explain_lines(doc: KeyDoc, values: list[tuple[str, list[tuple[str, Any, str]]]] = ()) -> list[str]:
    """``scalectl validate --explain`` as text: a key's description, type or allowed values,
    bounds and default; a section's keys one line each.  ``values``: per recipe file given,
    (file, :func:`recipe_values` of its merged recipe)."""
    title = f"[{doc.key}]" if doc.kind == "section" and doc.key else (doc.key or "recipe")
    lines = [title, f"  {doc.description or '(not described)'}"]
    if doc.kind == "section":
        lines += ["", *key_lines(doc)]
        for file, found in values:
            lines += ["", f"in {file}:"]
            lines += _table([(f"{key.rsplit('.', 1)[-1]} = {toml_text(value)}", f"({where})")
                             for key, value, where in found])
        return lines
    unset = ", or unset" if doc.optional else ""
    lines.append(f"  type: {doc.kind}{unset}" if not doc.allowed else
                 "  allowed" + (" (or unset)" if doc.optional else "") + ":")
    if doc.allowed:
        lines += _table([(v, n) for v, n in doc.allowed], indent="    ")
    if doc.bounds:
        lines.append(f"  bounds: {', '.join(doc.bounds)}")
    lines.append(f"  default: {doc.default}" + (f" ({doc.default_note})" if doc.default_note else ""))
    lines += [f"  in {file}: {toml_text(value)} ({where})" for file, found in values for _, value, where in found]
    return lines


def recipe_values(doc: KeyDoc, data: dict, origin: dict[str, str], overridden: Sequence[Any] = ()
                  ) -> list[tuple[str, Any, str]]:
    """(key, value, where it came from) in a merged recipe for a key, or for each value key of
    a section; ``data`` is ``Recipe.to_dict()``, ``origin`` the loader's ``origins``,
    ``overridden`` its :class:`~scalectl.recipe.layers.Overridden` list (the values of lower
    layers a key replaced are named after where it came from)."""
    keys = [k.key for k in doc.keys if k.kind != "section"] if doc.kind == "section" else [doc.key]
    replaced = {o.key: o for o in overridden}
    return [(key, value_at(data, key), provenance(key, origin, data) + _replaced(replaced.get(key)))
            for key in keys]


def _replaced(o: Any) -> str:
    """'; overrides 0.0001 from setups/tiny-cpu.toml' for an overridden key, else ''."""
    if o is None:
        return ""
    return "; overrides " + " and ".join(f"{toml_text(v)} from {shown_source(s)}" for v, s in o.replaced)


def value_at(data: dict, key: str) -> Any:
    """The value of a dotted key in a recipe's TOML-shaped data (``Recipe.to_dict()``)."""
    value: Any = data
    for part in [p for p in key.split(".") if p]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def provenance(key: str, origin: dict[str, str], data: dict) -> str:
    """Where a merged recipe's value of ``key`` came from, from the loader's origin map
    (:func:`scalectl.recipe.load.load`'s ``origins``): a file, ``--set``, the default of
    ``loss.type``, or the schema's default."""
    where = origin.get(key) or next((src for k, src in origin.items() if key.startswith(k + ".")), None)
    if where is None:
        parts = key.split(".")
        if parts[0] == "loss" and parts[-1] in COMPANIONS:
            return f"default of loss.type = {value_at(data, 'loss.type')!r}"
        return "default"
    if where.startswith(("--set", "default of")):
        return where
    return f"set in {shown_source(where)}"


def shown_source(source: str) -> str:
    """A layer's source as a person reads it: a packaged preset as ``setups/NAME.toml``, a
    file given by absolute path relative to the current folder when inside it, else as given."""
    if source.startswith(("--set", "default of")):
        return source
    path = Path(source)
    if not path.is_absolute():
        return source
    for base in (presets.root(), Path.cwd()):
        try:
            return os.path.normpath(path.relative_to(base))
        except ValueError:
            continue
    return source
