"""Ablation plans: which recipes to train, and how each differs from the base.

An ablation compares recipes at a small budget before the large run (Khatri
et al. 2025, "The Art of Scaling RL Compute for LLMs", arXiv 2510.13786,
sections 3-4): each candidate is trained to the same budget, its
compute-scaling sigmoid is fitted, and the higher ceiling A wins; only when
ceilings tie (within the 0.02 margin) does the faster rise (B, C_mid) decide.

Three kinds of ablation:

* ``forward``: from a base recipe, one axis changed at a time
  (``loss.type`` in ppo_clip, gspo, cispo; ``precision.lm_head`` in bf16,
  fp32; ``async.mode`` in ppo_off_policy, pipeline); the paper's section 3.
* ``leave_one_out``: from a base (ScaleRL), each listed choice reverted one
  at a time; the default list is the paper's seven (section 4, LOO
  variants), see :data:`SCALERL_LOO`.
* ``variants``: an explicit list of named variants, each a recipe file
  and/or overrides (e.g. the five published recipes against each other).

An ablation file (``ablations/*.toml``)::

    name = "scalerl-loo"              # default: the file's stem
    kind = "leave_one_out"            # forward | leave_one_out | variants
    description = "..."
    base = "../recipes/scalerl.toml"  # paths relative to the file
    setup = "../setups/tiny-cpu.toml" # default: setups/tiny-cpu.toml
    repeats = 1                       # seeds per variant
    set = ["budget.steps=150"]        # overrides applied to every run
    margin = 0.02                     # noise margin on A, or "auto" (default: the paper's 0.02)
    device_hours_per_step = 0.001     # optional configured cost rate
    baseline = "base"                 # variants kind: the variant judged against

    [forward]                         # forward kind: key -> values
    "loss.type" = ["ppo_clip", "gspo", "cispo"]

    [[variants]]                      # leave_one_out / variants kinds
    name = "loo-fp32"
    set = ["precision.lm_head=bf16"]
    recipe = "../recipes/x.toml"      # optional (default: the base recipe)
    what = "the FP32 head"            # what the variant removes (leave-one-out)

Everything here is pure apart from reading TOML files: :func:`plan` turns an
:class:`AblationSpec` into validated recipes, their diffs from the base, and
the run names ``<ablation>--<variant>--s<seed>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scalectl import presets
from scalectl.defaults import MARGIN
from scalectl.errors import UserError
from scalectl.names import check_name
from scalectl.recipe.load import (
    find_default_setup,
    flatten,
    load,
    parse_override,
    read_toml,
)
from scalectl.recipe.schema import UNHASHED_KEYS, Recipe

KINDS = ("forward", "leave_one_out", "variants")
#: Name of the base variant of forward and leave-one-out ablations.
BASE = "base"
#: Separator of the parts of a run name: ``<ablation>--<variant>--s<seed>``.
SEP = "--"
DEFAULT_MARGIN = MARGIN
#: A preset name (scalectl.presets.resolve): ./recipes/scalerl.toml, else the packaged one.
DEFAULT_BASE_RECIPE = presets.DEFAULT_RECIPE
_FILE_KEYS = {"name", "kind", "description", "base", "setup", "repeats", "set", "margin",
              "device_hours_per_step", "baseline", "forward", "variants"}
_VARIANT_KEYS = {"name", "recipe", "set", "what", "description"}


@dataclass(frozen=True)
class VariantSpec:
    """One variant as written: a recipe file (None: the ablation's base recipe)
    plus ``key=value`` overrides.  ``what`` names, for a leave-one-out variant,
    the choice it removes ("the FP32 head"), for the report's sentences."""

    name: str
    overrides: tuple[str, ...] = ()
    recipe: Path | None = None
    what: str = ""
    description: str = ""


#: ScaleRL's leave-one-out variants (paper section 4), each reverting one choice
#: of recipes/scalerl.toml; named as the paper does.
SCALERL_LOO: tuple[VariantSpec, ...] = (
    VariantSpec("loo-plan", ("advantage.normalization=prompt",),
                what="batch-level advantage normalization"),
    VariantSpec("loo-lp", ("length.control=penalty",), what="interruption as length control"),
    VariantSpec("loo-batch", ("filter.zero_variance=false",), what="zero-variance filtering"),
    VariantSpec("loo-8op", ("async.mode=ppo_off_policy", "async.k=8"), what="PipelineRL-8"),
    VariantSpec("loo-fp32", ("precision.lm_head=bf16",), what="the FP32 head"),
    VariantSpec("loo-savg", ("loss.aggregation=sample",), what="prompt-level loss aggregation"),
    VariantSpec("loo-dapo", ("loss.type=ppo_clip", "loss.clip_low=0.2", "loss.clip_high=0.28"),
                what="the CISPO loss"),
)


@dataclass(frozen=True)
class AblationSpec:
    """An ablation as written (file or command line), before any recipe is loaded.

    ``variants`` excludes the base for ``forward`` / ``leave_one_out`` (the base
    is the base recipe itself, named :data:`BASE`); for ``variants`` it lists
    every variant and ``baseline`` names the one the others are judged against.
    ``forward`` maps a dotted key to the values tried.  ``device_hours_per_step``
    (device-hours, GPU-hours on GPUs) is a configured cost rate, used when the
    store has no measured one.  ``margin``: the noise margin on A, or ``"auto"``
    (measured from the baseline recipe's seeds, :mod:`scalectl.science.margin`);
    ``margin_where`` says where a file set it ("" for the paper's default).
    """

    name: str
    kind: str
    base: Path | None
    setup: Path | None = None
    variants: tuple[VariantSpec, ...] = ()
    forward: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    baseline: str = BASE
    repeats: int = 1
    overrides: tuple[str, ...] = ()
    margin: float | str = DEFAULT_MARGIN
    device_hours_per_step: float | None = None
    description: str = ""
    source: Path | None = None
    margin_where: str = ""


@dataclass(frozen=True)
class Change:
    """One dotted key whose value differs from the base: ``old -> new``."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {format_value(self.old)} -> {format_value(self.new)}"


@dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: a variant at one seed, and its run name."""

    variant: str
    seed: int
    name: str
    recipe: Recipe

    @property
    def recipe_hash(self) -> str:
        return self.recipe.content_hash


@dataclass(frozen=True)
class PlannedVariant:
    """A variant's validated recipe (at the first seed), its changes from the
    base, its seeds, and the phrase that starts its sentence in the report
    ("Removing the FP32 head", "Changing loss.type from cispo to gspo")."""

    name: str
    recipe: Recipe
    changes: tuple[Change, ...]
    seeds: tuple[int, ...]
    is_base: bool
    lead: str
    what: str = ""

    @property
    def recipe_hash(self) -> str:
        return self.recipe.content_hash


@dataclass(frozen=True)
class Plan:
    """What an ablation trains: variants (baseline first) and their runs.

    ``notes`` says what the planner dropped (a forward value equal to the
    base's).  ``setup`` is the setup file every run was loaded with.
    """

    spec: AblationSpec
    setup: Path
    variants: tuple[PlannedVariant, ...]
    runs: tuple[PlannedRun, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def baseline(self) -> str:
        return next(v.name for v in self.variants if v.is_base)

    def variant(self, name: str) -> PlannedVariant:
        """The variant called ``name``.  Raises KeyError naming the known ones."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r} in ablation {self.spec.name} "
                       f"(variants: {[v.name for v in self.variants]})")

    def to_dict(self) -> dict:
        """JSON-ready description (the ablation's manifest, run names included)."""
        s = self.spec
        return {
            "name": s.name, "kind": s.kind, "description": s.description,
            "base": None if s.base is None else str(s.base), "setup": str(self.setup),
            "source": None if s.source is None else str(s.source), "repeats": s.repeats,
            "overrides": list(s.overrides), "margin": s.margin, "margin_where": s.margin_where,
            "baseline": self.baseline,
            "device_hours_per_step": s.device_hours_per_step, "notes": list(self.notes),
            "variants": [{"name": v.name, "is_base": v.is_base, "lead": v.lead, "what": v.what,
                          "recipe_hash": v.recipe_hash, "seeds": list(v.seeds),
                          "changes": [[c.key, c.old, c.new] for c in v.changes],
                          "fit_axis": v.recipe.fit.axis,
                          "runs": [r.name for r in self.runs if r.variant == v.name]}
                         for v in self.variants],
        }


# --------------------------------------------------------------------------- helpers


def format_value(value: Any) -> str:
    """A recipe value as written in a diff: strings bare, booleans lower-case, floats short."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def run_name(ablation: str, variant: str, seed: int) -> str:
    """``<ablation>--<variant>--s<seed>``, checked by :func:`scalectl.names.check_name`."""
    return check_name(f"{ablation}{SEP}{variant}{SEP}s{seed}", "run name of the ablation")


def parse_run_name(name: str) -> tuple[str, str, int] | None:
    """(ablation, variant, seed) of a run named by :func:`run_name` (a ``-N``
    suffix added to keep names unique is ignored); None for other names."""
    parts = name.split(SEP)
    if len(parts) != 3 or not parts[2].startswith("s"):
        return None
    seed = parts[2][1:].split("-")[0]
    if not seed.isdigit():
        return None
    return parts[0], parts[1], int(seed)


def check_part(name: str, what: str) -> str:
    """``name`` if it is a safe name (:func:`scalectl.names.check_name`) without ``--``.

    Raises:
        UserError: naming the value and what is allowed.
    """
    check_name(name, what)
    if SEP in name:
        raise UserError(f"{what} {name!r} may not contain {SEP!r} (it separates the parts of run names)")
    return name


def _explicit(overrides: tuple[str, ...]) -> dict[str, Any]:
    return dict(parse_override(o) for o in overrides)


def with_companions(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """Overrides plus the keys that must follow them.

    Setting ``loss.type`` without clip values would keep the base's clips
    (ScaleRL's CISPO eps_max 5.0 under a PPO clip): the companions of the new
    loss take its defaults unless given, by the rule every command follows
    (:func:`scalectl.recipe.loss_choices.companion_defaults`; the variant's own
    overrides are the layer, its type always counts as new).
    """
    from scalectl.recipe.loss_choices import companion_defaults

    layer = {key.removeprefix("loss."): value for key, value in _explicit(overrides).items()
             if key.startswith("loss.")}
    return tuple(overrides) + tuple(f"loss.{key}={value!r}" for key, value in companion_defaults(layer).items())


def diff(base: Recipe, other: Recipe) -> tuple[Change, ...]:
    """Dotted keys whose values differ between two recipes (name, description,
    seed, launcher and checkpoint frequency left out), in key order."""
    a = {k: v for k, v in flatten(base.to_dict()).items() if k.split(".")[0] not in UNHASHED_KEYS}
    b = {k: v for k, v in flatten(other.to_dict()).items() if k.split(".")[0] not in UNHASHED_KEYS}
    return tuple(Change(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


# --------------------------------------------------------------------------- specs


def parse_forward(text: str) -> tuple[str, tuple[Any, ...]]:
    """``loss.type=ppo_clip,gspo,cispo`` -> ("loss.type", ("ppo_clip", "gspo", "cispo")).

    Each value is read as a TOML value when it can be (numbers, booleans).

    Raises:
        UserError: no ``=``, an empty key, or no values.
    """
    if "=" not in text:
        raise UserError(f"--forward {text!r}: expected KEY=V1,V2,..., e.g. loss.type=ppo_clip,gspo,cispo")
    key, raw = text.split("=", 1)
    values = tuple(parse_override(f"{key}={v}")[1] for v in raw.split(",") if v.strip())
    if not key.strip() or not values:
        raise UserError(f"--forward {text!r}: expected KEY=V1,V2,..., e.g. loss.type=ppo_clip,gspo,cispo")
    return key.strip(), values


def leave_one_out_spec(base: str | Path = DEFAULT_BASE_RECIPE, *, name: str = "scalerl-loo",
                       variants: tuple[VariantSpec, ...] = SCALERL_LOO, **kw) -> AblationSpec:
    """A leave-one-out ablation of ``base`` (default ScaleRL's seven variants)."""
    return AblationSpec(name=check_part(name, "ablation name"), kind="leave_one_out",
                        base=Path(base), variants=variants, **kw)


def forward_spec(axes: list[tuple[str, tuple[Any, ...]]], base: str | Path = DEFAULT_BASE_RECIPE, *,
                 name: str | None = None, **kw) -> AblationSpec:
    """A forward ablation: each value of each axis tried on ``base``, one axis at a time.
    The default name is ``forward-`` and the axes' dotted keys."""
    if not axes:
        raise UserError("a forward ablation needs at least one axis (--forward KEY=V1,V2)")
    name = name or "forward-" + "+".join(k for k, _ in axes)
    return AblationSpec(name=check_part(name, "ablation name"), kind="forward", base=Path(base),
                        forward=tuple((k, tuple(v)) for k, v in axes), **kw)


def read_ablation(path: str | Path) -> AblationSpec:
    """Read an ablation file (format in the module docstring), given by path or
    preset name (``scalerl-loo``); paths in it are relative to the file.

    Raises:
        UserError: a missing or invalid file, an unknown key or kind, a bad
            name, or variants missing where the kind needs them.
    """
    path = presets.resolve(path, "ablations")
    data = read_toml(path, "ablation file")
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_FILE_KEYS))}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise UserError(f"{path}: kind = {kind!r} is not one of: {', '.join(KINDS)}")

    def rel(value, key, kind="recipes"):
        # a path relative to the file; a bare name with no such file beside it is a preset name
        if value is None:
            return None
        if not isinstance(value, str):
            raise UserError(f"{path}: {key} = {value!r} must be a path (string)")
        beside = Path(os.path.normpath(path.parent / value))
        if beside.exists() or not presets.is_bare(value):
            return beside
        try:
            return presets.resolve(value, kind)
        except UserError:
            raise UserError(f"{path}: {key} = {value!r}: no such file beside the ablation file ({beside}), and not "
                            f"the name of a {kind[:-1]} preset ({kind}: {', '.join(presets.names(kind))})") from None

    def strings(value, key):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{path}: {key} must be a list of \"key=value\" strings")
        for v in value:
            parse_override(v)
        return tuple(value)

    variants = []
    for i, v in enumerate(data.get("variants", [])):
        if not isinstance(v, dict) or "name" not in v:
            raise UserError(f"{path}: variants[{i}] needs a name")
        bad = sorted(set(v) - _VARIANT_KEYS)
        if bad:
            raise UserError(f"{path}: variants[{i}] ({v['name']}): unknown key(s) {', '.join(bad)}; "
                            f"allowed: {', '.join(sorted(_VARIANT_KEYS))}")
        variants.append(VariantSpec(check_part(v["name"], f"{path}: variant name"),
                                    strings(v.get("set", []), f"variants[{i}].set"),
                                    rel(v.get("recipe"), f"variants[{i}].recipe"), v.get("what", ""),
                                    v.get("description", "")))
    forward = data.get("forward", {})
    if not isinstance(forward, dict) or not all(isinstance(x, list) and x for x in forward.values()):
        raise UserError(f"{path}: [forward] maps a dotted key to a non-empty list of values")
    if kind == "forward" and (not forward or variants):
        raise UserError(f"{path}: a forward ablation lists its axes in [forward] (and no [[variants]])")
    if kind == "variants" and not variants:
        raise UserError(f"{path}: a variants ablation needs [[variants]]")
    if kind != "forward" and forward:
        raise UserError(f"{path}: [forward] belongs to kind = \"forward\" only")
    repeats = data.get("repeats", 1)
    if not isinstance(repeats, int) or repeats < 1:
        raise UserError(f"{path}: repeats = {repeats!r} must be an integer >= 1")
    margin = data.get("margin", DEFAULT_MARGIN)
    if margin != "auto":
        from scalectl.science.margin import check_value

        margin = check_value(margin, f"{path}: margin")
    rate = data.get("device_hours_per_step")
    if rate is not None and (not isinstance(rate, (int, float)) or rate <= 0):
        raise UserError(f"{path}: device_hours_per_step = {rate!r} must be a number > 0")
    base = rel(data.get("base"), "base")
    if base is None and kind != "variants":
        raise UserError(f"{path}: a {kind} ablation needs base = \"RECIPE.toml\"")
    if base is None and any(v.recipe is None for v in variants):
        raise UserError(f"{path}: every variant needs a recipe when the ablation has no base")
    default_baseline = variants[0].name if kind == "variants" else BASE
    return AblationSpec(
        name=check_part(data.get("name", path.stem), f"{path}: ablation name"), kind=kind, base=base,
        setup=rel(data.get("setup"), "setup", "setups"), variants=tuple(variants),
        forward=tuple((k, tuple(v)) for k, v in forward.items()),
        baseline=data.get("baseline", default_baseline), repeats=repeats,
        overrides=strings(data.get("set", []), "set"), margin=margin,
        margin_where=f"margin = {margin!r} in {path}" if "margin" in data else "",
        device_hours_per_step=None if rate is None else float(rate),
        description=data.get("description", ""), source=path)


# --------------------------------------------------------------------------- the plan


def _forward_variants(spec: AblationSpec) -> list[VariantSpec]:
    all_values = [v for _, values in spec.forward for v in values]
    out = []
    for key, values in spec.forward:
        leaf = key.split(".")[-1]
        for value in values:
            text = format_value(value)
            unique = isinstance(value, str) and all_values.count(value) == 1
            name = text if unique else f"{leaf}={text}"
            out.append(VariantSpec(name, (f"{key}={value!r}" if isinstance(value, str) else f"{key}={text}",)))
    return out


def plan(spec: AblationSpec, *, setup: str | Path | None = None, overrides: tuple[str, ...] = (),
         repeats: int | None = None) -> Plan:
    """Load every variant's recipe and lay out the runs.

    Args:
        spec: the ablation.
        setup: setup file (default: the spec's, else setups/tiny-cpu.toml).
        overrides: ``key=value`` applied to every run after the spec's own
            (e.g. ``budget.steps=4``).
        repeats: seeds per variant (default: the spec's); seeds are the base
            recipe's seed and the next ``repeats - 1`` integers.

    Returns:
        The :class:`Plan`; the baseline comes first.

    Raises:
        UserError: a recipe that does not load or validate (naming the
            variant), two variants with the same name or training content, a
            variant identical to the base, or a run name that is too long.
    """
    repeats = spec.repeats if repeats is None else repeats
    if repeats < 1:
        raise UserError(f"repeats = {repeats} must be >= 1")
    first_recipe = spec.base or spec.variants[0].recipe
    setup_path = Path(setup) if setup is not None else (spec.setup or find_default_setup(first_recipe))
    common = tuple(spec.overrides) + tuple(overrides)

    def load_variant(v: VariantSpec, seed: int | None = None, layers: _Layers | None = None) -> Recipe:
        extra = with_companions(v.overrides) + ((f"name={v.name!r}",) if v.name != BASE else ())
        try:
            return load(v.recipe or spec.base, setup_path,
                        common + extra + ((f"seed={seed}",) if seed is not None else ()),
                        **({} if layers is None else {"origins": layers.origin, "overridden": layers.overridden}))
        except UserError as exc:
            raise UserError(f"variant {v.name}: {exc}") from None

    if spec.kind == "variants":
        specs = list(spec.variants)
        names = [v.name for v in specs]
        if spec.baseline not in names:
            raise UserError(f"baseline {spec.baseline!r} is not one of the variants: {', '.join(names)}")
        specs.sort(key=lambda v: v.name != spec.baseline)
    else:
        extra = _forward_variants(spec) if spec.kind == "forward" else list(spec.variants)
        specs = [VariantSpec(BASE)] + extra
    names = [v.name for v in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UserError(f"ablation {spec.name}: variant name {dup!r} appears twice")

    base_layers = _Layers()
    base_recipe = load_variant(specs[0], layers=base_layers)
    seed0 = base_recipe.seed
    seeds = tuple(range(seed0, seed0 + repeats))
    variants, runs, notes, hashes = [], [], [], {}
    for v in specs:
        layers = _Layers()
        recipe = base_recipe if v is specs[0] else load_variant(v, layers=layers)
        changes = () if v is specs[0] else diff(base_recipe, recipe)
        h = recipe.content_hash
        if v is not specs[0] and h == base_recipe.content_hash:
            if spec.kind == "forward" and not changes:
                key, value = parse_override(v.overrides[0])
                notes.append(f"{key} = {format_value(value)} is the base's own value: the base stands for it")
                continue
            raise UserError(same_as_base(v, specs[0].name, base_recipe, recipe, changes, base_layers, layers))
        if h in hashes:
            raise UserError(f"variants {hashes[h]} and {v.name} train the same recipe (hash {h})")
        hashes[h] = v.name
        variants.append(PlannedVariant(v.name, recipe, changes, seeds, v is specs[0],
                                       _lead(spec, v, changes, specs[0].name), v.what))
        for s in seeds:
            runs.append(PlannedRun(v.name, s, run_name(spec.name, v.name, s),
                                   recipe if s == recipe.seed else load_variant(v, s)))
    return Plan(replace(spec, repeats=repeats, overrides=common), setup_path, tuple(variants), tuple(runs),
                tuple(notes))


@dataclass
class _Layers:
    """Where a loaded variant's keys came from (the loader's ``origins``) and what replaced
    what (its ``overridden``: :mod:`scalectl.recipe.layers`)."""

    origin: dict[str, str] = field(default_factory=dict)
    overridden: list = field(default_factory=list)

    def sources(self) -> set[str]:
        """Every file or ``--set`` that set a key, whether its value won or was replaced."""
        return set(self.origin.values()) | {src for o in self.overridden for _, src in o.replaced}


#: Keys of a recipe the content hash leaves out besides :data:`UNHASHED_KEYS` (speed only).
_SPEED_KEYS = ("hardware.threads", "eval.background")


def same_as_base(v: VariantSpec, baseline: str, base: Recipe, recipe: Recipe, changes: tuple[Change, ...],
                 base_layers: _Layers, layers: _Layers) -> str:
    """Why variant ``v`` resolves to the baseline's content hash, key by key: each key the
    variant sets (in its recipe file or its ``set``) that another layer overrode, that is the
    baseline's own value, or that the hash leaves out.  The message of the refusal: such a
    variant would reuse the baseline's runs and report a tie."""
    from scalectl.recipe.explain import shown_source, toml_text, value_at

    theirs = base_layers.sources()
    own_sources = layers.sources() - theirs
    reasons = [f"{o.key} = {toml_text(val)} from {shown_source(src)} is overridden by "
               f"{toml_text(o.value)} from {shown_source(o.source)}"
               for o in layers.overridden for val, src in o.replaced if src in own_sources]
    own = {k: src for k, src in layers.origin.items() if src in own_sources and k != "name"}
    own.update({k: f"--set {k}" for k in _explicit(v.overrides) if k != "name"})
    data, base_data = recipe.to_dict(), base.to_dict()
    for key in sorted(own):
        value, where = value_at(data, key), shown_source(own[key])
        if key.split(".")[0] in UNHASHED_KEYS or key in _SPEED_KEYS:
            reasons.append(f"{key} (from {where}) is left out of the content hash (it changes how or "
                           f"where a run goes, not what it trains)")
        elif value == value_at(base_data, key):
            reasons.append(f"{key} = {toml_text(value)} from {where} is {baseline}'s own value")
    if not reasons:
        reasons = [f"{'; '.join(map(str, changes))} only" if changes else "it sets no key of its own"]
    return (f"variant {v.name} trains exactly what {baseline} trains (content hash {base.content_hash}): "
            + "; ".join(reasons) + f". It would reuse {baseline}'s runs and report a tie: change a training "
            "key, or drop the variant")


def _lead(spec: AblationSpec, v: VariantSpec, changes: tuple[Change, ...], baseline: str) -> str:
    """The subject of a variant's sentence in the report ('' for the baseline)."""
    if v.name == baseline:
        return ""
    if spec.kind == "leave_one_out":
        return f"Removing {v.what}" if v.what else "Reverting " + "; ".join(map(str, changes[:3]))
    if spec.kind == "forward":
        key = _explicit(v.overrides)
        k = next(iter(key), None)
        old = next((c.old for c in changes if c.key == k), None)
        return f"Changing {k} from {format_value(old)} to {format_value(key.get(k))}"
    return f"Switching from {baseline} to {v.name}"
