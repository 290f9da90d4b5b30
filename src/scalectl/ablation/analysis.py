"""An ablation's analysis: fit every variant, judge each against the baseline, say it in a sentence.

:func:`gather` reads an ablation's runs from the store and fits each variant
(the seeds of a variant pooled into one curve, with the fit window of
:func:`scalectl.science.fits.fit_window`; each seed also fitted alone to show the
seed spread), then judges every variant against the baseline with
:func:`scalectl.science.compare.compare` (margin :data:`scalectl.defaults.MARGIN`:
three seeds of one recipe gave ceilings within +-0.015, Khatri et al. 2025,
arXiv 2510.13786, section 3).  It returns data; :mod:`scalectl.ablation.report` draws
and writes the report, the command prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalectl.science.compare import BASELINE, FASTER, HIGHER, LOWER, SLOWER, SPEED_UNDECIDED, Comparison, LooLine, RunCurve, Row
from scalectl.curve import SigmoidFit
from scalectl.defaults import MARGIN, TRUNCATION_THRESHOLD
from scalectl.display import format_compute, format_estimate


@dataclass
class VariantResult:
    """One variant in the report.

    ``curve`` is the pooled fit over its seeds (None with ``error`` when it
    could not be fitted); ``seed_fits`` the per-seed fits when there are
    several; ``truncation`` one (compute (n,), truncation rate (n,)) pair per run.
    """

    name: str
    is_base: bool
    lead: str
    changes: list[tuple[str, Any, Any]]
    runs: list[dict]
    curve: RunCurve | None = None
    error: str | None = None
    seed_fits: list[SigmoidFit] = field(default_factory=list)
    truncation: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    sentence: str = ""


@dataclass
class AblationResult:
    """Everything the report shows; :func:`gather` builds it."""

    name: str
    kind: str
    description: str
    baseline: str
    margin: float
    axis: str
    plan: dict
    variants: list[VariantResult]
    comparison: Comparison | None = None
    loo: list[LooLine] | None = None
    loo_error: str | None = None
    truncation_threshold: float = TRUNCATION_THRESHOLD
    notes: list[str] = field(default_factory=list)
    margin_source: dict = field(default_factory=dict)

    def variant(self, name: str) -> VariantResult:
        """The variant called ``name``.  Raises KeyError naming the known ones."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r} (variants: {[v.name for v in self.variants]})")

    def to_dict(self) -> dict:
        """JSON-ready summary: fits, verdicts and sentences."""
        return {
            "name": self.name, "kind": self.kind, "baseline": self.baseline, "margin": self.margin,
            "margin_source": self.margin_source,
            "axis": self.axis, "plan": self.plan, "notes": self.notes,
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "variants": [{"name": v.name, "runs": v.runs, "error": v.error, "sentence": v.sentence,
                          "fit": None if v.curve is None else v.curve.fit.to_dict(),
                          "seed_fits": [f.to_dict() for f in v.seed_fits]} for v in self.variants],
        }


def gather(store, manifest: dict, *, bootstrap: int = 1000, seed: int = 0, margin: float | None = None
           ) -> AblationResult:
    """Fit every variant of an ablation and compare them with the baseline.

    Args:
        store: an open :class:`scalectl.store.database.Store`.
        manifest: the ablation as :meth:`scalectl.ablation.Plan.to_dict` gives
            it, ``variants[i]["runs"]`` naming the stored runs of variant i.
        bootstrap: bootstrap resamples per fit (0: no intervals, and every
            comparison is undecided or decided on point values only).
        seed: bootstrap seed.
        margin: noise margin on A, or ``"auto"`` (measured from the baseline recipe's seeds in
            the store); default: the manifest's, else :data:`~scalectl.defaults.MARGIN`
            (:func:`scalectl.science.margin.for_ablation`; ``margin_source`` says which).

    Returns:
        The :class:`AblationResult`, sentences filled in.  Variants without
        runs, points or a fit carry an ``error`` instead of a curve.
    """
    from scalectl.science.fits import FitOptions
    from scalectl.science.margin import for_ablation

    opts = FitOptions(bootstrap=bootstrap, seed=seed)
    thresholds: list[float] = []        # the truncation threshold of every stored run, in order
    variants = [_fit_variant(store, v, opts, thresholds) for v in manifest["variants"]]
    axes = {v.curve.fit.axis for v in variants if v.curve is not None}
    baseline = manifest.get("baseline") or variants[0].name
    base_hash = next((v.get("recipe_hash") for v in manifest["variants"] if v["name"] == baseline), None)
    used = for_ablation(store, margin, manifest.get("margin", MARGIN), manifest.get("margin_where", ""),
                        base_hash, opts)
    result = AblationResult(
        name=manifest["name"], kind=manifest.get("kind", "unknown"), margin_source=used.to_dict(),
        description=manifest.get("description", ""), baseline=baseline, margin=used.value,
        axis=", ".join(sorted(axes)) or "-", plan=manifest, variants=variants,
        truncation_threshold=max(thresholds) if thresholds else TRUNCATION_THRESHOLD,
        notes=list(manifest.get("notes", [])))
    _judge(result)
    return result


def _fit_variant(store, v: dict, opts, thresholds: list[float]) -> VariantResult:
    """One variant of the manifest: its runs (missing ones named), each fitted
    (:func:`scalectl.science.fits.fit_run`), and its curve: the one run's, or the pooled fit of
    its seeds (:func:`_pool`); an ``error`` instead when there is none.  Appends each stored
    run's truncation threshold to ``thresholds``."""
    from scalectl.errors import UserError
    from scalectl.science.fits import fit_run, load_points

    res = VariantResult(v["name"], bool(v.get("is_base")), v.get("lead", ""),
                        [tuple(c) for c in v.get("changes", [])], [])
    curves = []
    for ref in v.get("runs", []):
        try:
            run = store.get_run(ref)
        except UserError:
            res.runs.append({"name": ref, "status": "missing", "points": 0})
            continue
        pts = store.points(run["id"])
        res.runs.append({"name": run["name"], "status": run["status"], "seed": run.get("seed"),
                         "points": len(pts)})
        section = (run.get("recipe") or {}).get("fit") or {}
        thresholds.append(float(section.get("truncation_threshold", TRUNCATION_THRESHOLD)))
        if not pts:
            continue
        try:
            curve = fit_run(store, run, opts)[0]
            x, _, t = load_points(store, run, curve.fit.axis)
        except UserError as exc:
            res.error = str(exc)
            continue
        curves.append((curve, section))
        res.truncation.append((x, t))
    if not curves:
        missing = all(r["status"] == "missing" for r in res.runs)
        res.error = res.error or ("no run in the store" if missing else "no evaluation points yet")
    elif len(curves) == 1:
        res.curve = curves[0][0]
    else:
        _pool(res, curves, opts, thresholds[-1])
    return res


def _pool(res: VariantResult, curves: list[tuple], opts, threshold: float) -> None:
    """The variant's curve from the points of all its seeds together (each seed's own fit kept
    in ``seed_fits``), fitted over the first seed's window rule; the error of a pooled fit
    that fails."""
    from scalectl.curve import FitError, fit_sigmoid
    from scalectl.science.fits import fit_r0, fit_window, parse_r0

    res.seed_fits = [c.fit for c, _ in curves]
    axis = curves[0][0].fit.axis
    x = np.concatenate([c.compute for c, _ in curves])
    y = np.concatenate([c.pass_rate for c, _ in curves])
    min_c = fit_window(curves[0][1], axis, x)
    try:
        fit = fit_sigmoid(x, y, min_compute=min_c, r0=parse_r0(fit_r0(curves[0][1])), axis=axis,
                          bootstrap=opts.bootstrap, seed=opts.seed,
                          truncation=np.concatenate([t for _, t in res.truncation]),
                          truncation_threshold=threshold)
        res.curve = RunCurve(x, y, fit, curves[0][0].hardware)
    except (FitError, ValueError) as exc:
        res.error = f"pooled fit of {len(curves)} seeds: {exc}"


def _judge(result: AblationResult) -> None:
    """Compare the fitted variants with the baseline (no verdicts without its fit), draw the
    leave-one-out lines of two or more, and write each variant's sentence."""
    from scalectl.curve import FitError
    from scalectl.science import compare as cmp

    variants, baseline, margin = result.variants, result.baseline, result.margin
    fitted = {v.name: v.curve for v in variants if v.curve is not None}
    base = next((v for v in variants if v.name == baseline), None)
    if base is None or base.curve is None:
        result.notes.append(f"the baseline {baseline} has no fit ({base.error if base else 'not in the ablation'}): "
                            "no verdicts")
    else:
        result.comparison = cmp.compare(fitted, baseline=baseline, margin=margin)
    if len(fitted) >= 2:
        try:
            result.loo = cmp.loo_lines(fitted, margin=margin)    # ceilings apart: each its own A
        except (FitError, ValueError) as exc:
            result.loo_error = str(exc)
    for v in variants:
        row = None
        if result.comparison is not None and v.curve is not None:
            row = result.comparison.row(v.name)
        v.sentence = sentence(v, row, None if base is None or base.curve is None else base.curve.fit,
                              margin)
    for c in result.comparison.crossings if result.comparison is not None else ():
        if baseline not in (c.first, c.second):
            continue
        v = result.variant(c.second if c.first == baseline else c.first)
        v.sentence += (f" {c.first}, with the lower ceiling, leads {c.second} at {format_compute(c.start)}, the "
                       f"compute both reached, and is overtaken at {format_compute(c.compute)} (forecast): "
                       "a faster start, not a higher ceiling.")


def _pair(a: float, b: float) -> tuple[str, str]:
    """Two ceilings to two decimals, or three when two would print them equal."""
    x, y = f"{a:.2f}", f"{b:.2f}"
    return (x, y) if x != y else (f"{a:.3f}", f"{b:.3f}")


def sentence(v: VariantResult, row: Row | None, base_fit: SigmoidFit | None, margin: float) -> str:
    """One plain sentence on a variant's verdict against the baseline, e.g.
    "Removing the FP32 head lowered the ceiling from 0.61 to 0.55, beyond the
    0.02 margin."  (verdict rules: :mod:`scalectl.science.compare`)."""
    subject = v.lead or f"Variant {v.name}"
    if v.is_base or (row is not None and row.verdict == BASELINE):
        if v.curve is None:
            return f"{v.name} is the baseline; it could not be fitted: {v.error}."
        f = v.curve.fit
        return (f"{v.name} is the baseline: ceiling A {format_estimate(f.A, f.interval('A'))}, "
                f"B {f.B:.2f}, C_mid {f.C_mid:.4g}.")
    if v.curve is None:
        return f"{subject} could not be judged: {v.error}."
    if row is None or base_fit is None:
        return f"{subject} could not be judged: the baseline has no fit."
    old, new = _pair(base_fit.A, row.A)
    lo, hi = row.delta_A_interval
    m = f"{margin:g}"
    if row.verdict == HIGHER:
        return f"{subject} raised the ceiling from {old} to {new}, beyond the {m} margin."
    if row.verdict == LOWER:
        return f"{subject} lowered the ceiling from {old} to {new}, beyond the {m} margin."
    if row.verdict in (FASTER, SLOWER):
        speed = "faster" if row.verdict == FASTER else "slower"
        b = "" if row.shared_A is None else f" (with A shared at {row.shared_A:.3f}: {row.reason.split('shared: ', 1)[-1]})"
        if row.speed_interval is not None:
            lo_s, hi_s = row.speed_interval
            b = (f" (it needs x{row.speed_ratio:.2f} [{lo_s:.2f}, {hi_s:.2f}] of the baseline's compute "
                 "to reach 80% of its rise)")
        return (f"{subject} left the ceiling within the {m} margin ({old} -> {new}): "
                f"a tie on ceiling, {speed} rise{b}.")
    if row.verdict == SPEED_UNDECIDED:
        return (f"{subject} left the ceiling within the {m} margin ({old} -> {new}): a tie on "
                f"ceiling; whether it rises faster is undecided ({row.reason.split('; ', 1)[-1]}).")
    if "not identified" in row.reason:     # fitted ceilings that are not identified are no move to report
        return (f"{subject} is undecided: {row.reason} (the fitted ceilings, {old} and {new}, are not yet "
                "a difference: extend the runs).")
    return (f"{subject} moved the ceiling from {old} to {new}, but the interval of the difference "
            f"[{lo:+.3f}, {hi:+.3f}] straddles the {m} margin: undecided (train longer or add seeds).")
