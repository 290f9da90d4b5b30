"""The precedence of a run's layers, and what each layer overrode.

A run's recipe is merged from four layers, lowest first:

1. the schema's defaults (:mod:`scalectl.recipe.schema`),
2. the setup (``setups/*.toml``: model, data, hardware, budget and the scale defaults:
   batch, token budgets, learning rate, held-out size),
3. the recipe file with its ``extends`` chain (each file over the one it extends),
4. ``--set KEY=VALUE``, in the order given.

A key a higher layer sets wins over the layers below it, key by key (tables merge key by
key).  So a recipe that sets ``optim.lr`` trains with its own learning rate on every setup,
and a setup gives only what the recipe leaves unset.  Every command that merges recipes
follows this one rule (:func:`scalectl.recipe.load.load`: ``run``, ``validate``, the variants
of ``ablate``); a resumed run keeps its stored, already merged recipe and only ``--set``
lies over it (:func:`scalectl.recipe.load.resumed_recipe`).

Where a layer replaces a value another layer set explicitly, :func:`overridden` names both
(``optim.lr = 0.5 from recipes/lr.toml overrides 0.0001 from setups/tiny-cpu.toml``), and
``validate`` and ``run`` print that line.  Pure functions: no file is read here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scalectl.recipe.explain import shown_source, toml_text

#: The layers in order of precedence, lowest first (README "Recipes and setups").
PRECEDENCE = ("schema default", "setup", "recipe file (with its extends chain)", "--set")


@dataclass(frozen=True)
class Layer:
    """One layer's explicit values: ``values`` maps a dotted key to its value (a flattened
    table), ``origin`` a dotted key (or a table's key) to where it was set (a file's path,
    ``--set KEY``); ``fallback`` names the layer where ``origin`` has no entry.

    Both mappings are copied when the layer is made: the loader goes on filling its own
    origin table with the higher layers' entries (``--set KEY``), which must not become
    this layer's sources."""

    values: Mapping[str, Any]
    origin: Mapping[str, str]
    fallback: str

    def __post_init__(self):
        object.__setattr__(self, "values", dict(self.values))
        object.__setattr__(self, "origin", dict(self.origin))

    def source(self, key: str) -> str:
        """Where this layer set ``key``: its own entry, else the entry of a table holding it."""
        if key in self.origin:
            return self.origin[key]
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            found = self.origin.get(".".join(parts[:i]))
            if found is not None:
                return found
        return self.fallback


@dataclass(frozen=True)
class Overridden:
    """A key whose final value replaced what a lower layer set explicitly.

    ``value`` and ``source``: the value that won and where it was set; ``replaced``: the
    (value, source) of each lower layer that set another value, highest first.
    """

    key: str
    value: Any
    source: str
    replaced: tuple[tuple[Any, str], ...]

    def __str__(self) -> str:
        lower = " and ".join(f"{toml_text(v)} from {shown_source(s)}" for v, s in self.replaced)
        return f"{self.key} = {toml_text(self.value)} from {shown_source(self.source)} overrides {lower}"

    def to_dict(self) -> dict:
        """JSON-ready: key, value, from, and the replaced values with where each was set."""
        return {"key": self.key, "value": self.value, "from": shown_source(self.source),
                "overrides": [{"value": v, "from": shown_source(s)} for v, s in self.replaced]}


def overridden(layers: Sequence[Layer]) -> list[Overridden]:
    """The keys of ``layers`` (lowest first) whose winning value replaced another layer's
    explicit, different value, in key order.

    A companion value the loss rule laid in (source ``default of loss.type ...``, reported
    by the loader's notes) is not counted as an override here.
    """
    out = []
    keys = sorted({k for layer in layers for k in layer.values})
    for key in keys:
        setters = [(layer.values[key], layer.source(key)) for layer in layers if key in layer.values]
        value, source = setters[-1]
        if source.startswith("default of"):
            continue
        replaced = tuple((v, s) for v, s in reversed(setters[:-1]) if v != value)
        if replaced:
            out.append(Overridden(key, value, source, replaced))
    return out
