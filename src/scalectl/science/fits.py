"""Fits of stored runs: a run's points read from the store on one compute axis,
fitted with :func:`scalectl.curve.fit_sigmoid` and cached in the ``fits`` table
(recomputed only when the run's points change).  Used by ``scalectl fit``,
``compare``, ``extrapolate`` and the ablation report alike.

The points are the run's validation points, or those of one of its evaluation series
(``scalectl evaluate``: :attr:`FitOptions.series`).  A run without values on the axis asked
for (``--axis``, else its recipe's ``fit.axis``, else GPU-hours), such as a run imported from a
tracker that logged steps only, is fitted on the first axis of :data:`AXES` it has, and a
note says so (:func:`choose_axis`): runs on different axes are each fitted on what they have.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from scalectl.defaults import TRUNCATION_THRESHOLD
from scalectl.errors import UserError

AXES = ("gpu_hours", "flops", "tokens", "step")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass(frozen=True)
class FitOptions:
    """Settings of a fit from the command line (None: from the recipe or the default)."""

    axis: str | None = None
    min_compute: float | None = None
    method: str = "vp"
    #: ``--r0``: None takes the recipe's ``fit.r0`` (:func:`fit_r0`).
    r0: str | None = None
    bootstrap: int = 1000
    level: float = 0.95
    seed: int = 0
    #: An evaluation series of the run (``scalectl evaluate``) to fit instead of its validation points.
    series: str | None = None
    #: Fit only the points at steps up to this one: a run trained further read as the run of that
    #: budget (its points are those of the shorter run: the budget only says when training stops).
    until_step: int | None = None


def fit_section(run: dict) -> dict:
    return (run.get("recipe") or {}).get("fit") or {}


def resolve_axis(run: dict, opts: FitOptions) -> str:
    axis = opts.axis or fit_section(run).get("axis") or "gpu_hours"
    if axis not in AXES:
        raise UserError(f"--axis {axis!r} is not one of: {', '.join(AXES)}")
    return axis


def check_options(opts: FitOptions) -> None:
    """Refuse the options that no run could be fitted with, before any run is read:
    ``--axis`` not one of :data:`AXES`, ``--method`` not ``vp`` or ``grid``, a bad ``--r0``.

    Raises:
        UserError: naming the option and its allowed values.
    """
    if opts.axis is not None and opts.axis not in AXES:
        raise UserError(f"--axis {opts.axis!r} is not one of: {', '.join(AXES)}")
    if opts.method not in ("vp", "grid"):
        raise UserError(f"--method {opts.method!r} is not one of: vp, grid")
    if opts.r0 is not None:
        parse_r0(opts.r0)


def fit_r0(section: dict, override: str | None = None) -> str:
    """How a run's fit finds R0: ``override`` (``--r0``) when given, else the recipe's
    ``fit.r0``, else ``auto`` (the measured step-0 pass rate, fitted where there is none).

    Args:
        section: the run's recipe ``fit`` section (a dict, possibly empty).
    """
    if override is not None:
        return override
    return str(section.get("r0") or "auto")


def parse_r0(value: str) -> str | float:
    if value in ("auto", "measured", "fit"):
        return value
    try:
        return float(value)
    except ValueError:
        raise UserError(f"--r0 {value!r} is not one of: auto, measured, fit, or a number "
                        "in [0, 1]") from None


def _no_points(store, run: dict, series: str | None) -> UserError:
    """The error of a run without points (naming the run's series when ``series`` has none)."""
    if series is None:
        return UserError(f"run {run['name']!r} has no evaluation points yet")
    names = [s["series"] for s in store.series(run["id"])]
    return UserError(f"run {run['name']!r} has no evaluation series {series!r}; its series: "
                     f"{', '.join(names) or 'none'} (scalectl evaluate {run['name']} makes one)")


def choose_axis(store, run: dict, opts: FitOptions, log=_stderr) -> str:
    """The axis a run is fitted on: the one asked for (:func:`resolve_axis`) when the run has
    values on it, else the first axis of :data:`AXES` it has values on, said through ``log``.

    Raises:
        UserError: an unknown axis, a run without points.
    """
    wanted = resolve_axis(run, opts)
    rows = store.point_values(run["id"], [*AXES, "pass_rate"], series=opts.series)
    if not rows:
        raise _no_points(store, run, opts.series)
    has = [a for i, a in enumerate(AXES) if any(r[i] is not None and r[-1] is not None for r in rows)]
    if wanted in has or not has:
        return wanted
    asked = "asked for by --axis" if opts.axis else "its default axis"
    log(f"note: run {run['name']} has no {wanted} values ({asked}); fitted on {has[0]}, the axis it has")
    return has[0]


def load_points(store, run: dict, axis: str, log=_stderr, series: str | None = None,
                until_step: int | None = None) -> tuple:
    """(compute, pass_rate, truncation_rate) of a run on ``axis`` (of its evaluation series
    ``series`` when given), each (n,) in step order; points without a value dropped (and
    counted in a line to ``log``); with ``until_step``, only the points at steps up to it.  Reads
    only those columns (:meth:`scalectl.store.database.Store.point_values`): a run of 300,000
    points costs arrays, not a dict per point."""
    import numpy as np

    if until_step is None:
        rows = store.point_values(run["id"], [axis, "pass_rate", "truncation_rate"], series=series)
    else:
        rows = [r[1:] for r in store.point_values(run["id"], ["step", axis, "pass_rate", "truncation_rate"],
                                                  series=series) if r[0] <= until_step]
    if not rows:
        raise _no_points(store, run, series)
    have = [r for r in rows if r[0] is not None and r[1] is not None]
    if not have:
        filled = [a for a in AXES
                  if any(v is not None for (v,) in store.point_values(run["id"], [a], series=series))]
        raise UserError(f"run {run['name']!r} has no {axis!r} values; axes with values: "
                        f"{', '.join(filled) or 'none'} (choose one with --axis)")
    if len(have) < len(rows):
        log(f"run {run['name']}: {len(rows) - len(have)} points without {axis} left out")
    values = np.array(have, dtype=float)          # None (no truncation rate) becomes NaN
    return values[:, 0], values[:, 1], values[:, 2]


def r0_standard_error(store, run: dict, axis: str, series: str | None = None) -> float | None:
    """Standard error of the run's evaluation at compute 0 (from its per-prompt correct
    counts), or None when there is none or it did not store them."""
    import json

    from scalectl.curve import evaluation_standard_error

    zero = store.point_values(run["id"], ["correct_counts", "samples_per_prompt"], zero=axis, series=series)
    ses = [evaluation_standard_error(json.loads(c), k or 0) for c, k in zero if c]
    ses = [s for s in ses if s is not None]
    return None if not ses else (sum(s * s for s in ses) / len(ses)) ** 0.5   # per evaluation


def fit_window(section: dict, axis: str, compute, override: float | None = None) -> float:
    """Where a run's fit window starts, in ``axis`` units: the rule every fit of stored points uses.

    ``override`` (``--min-compute``) when given; else the recipe's ``fit.min_compute`` when its
    ``fit.axis`` is ``axis`` (a bound in other units means nothing here); else
    :func:`scalectl.curve.default_min_compute` of the points' ``compute``.

    Args:
        section: the run's recipe ``fit`` section (a dict, possibly empty).
        compute: the points' compute on ``axis``.
    """
    from scalectl.curve import default_min_compute

    if override is not None:
        return float(override)
    if "min_compute" in section and section.get("axis", "gpu_hours") == axis:
        return float(section["min_compute"])
    return default_min_compute(compute, axis)


def thin(x, y, truncation, min_compute: float, log=None, name: str = "") -> tuple:
    """The points a stored run is fitted on: (x, y, truncation, note).  Points at compute 0
    stay; the points before the window and those in it (compute >= ``min_compute``) are each
    cut into at most :data:`scalectl.curve.solvers.MAX_FIT_POINTS` bins of consecutive points
    (:func:`scalectl.curve.solvers.bin_points`: equal counts, mean pass rate at the geometric
    mean compute) when there are more, so a fit's time and memory stay bounded whatever the
    run's length; ``note`` says so (None when nothing was binned), and is logged."""
    import numpy as np

    from scalectl.curve.solvers import MAX_FIT_POINTS, bin_points

    log = log or _stderr
    zero, before, window = x == 0, (x > 0) & (x < min_compute), (x > 0) & (x >= min_compute)
    if before.sum() <= MAX_FIT_POINTS and window.sum() <= MAX_FIT_POINTS:
        return x, y, truncation, None
    parts = [(x[zero], y[zero], truncation[zero])]
    for part in (before, window):
        xb, yb, tb, _ = bin_points(x[part], y[part], truncation[part])
        parts.append((xb, yb, tb))
    n = int(window.sum())
    size = n // MAX_FIT_POINTS
    note = (f"run {name}: {n:,} points in the fit window, fitted as {min(n, MAX_FIT_POINTS):,} bins of "
            f"{size}{'' if n % MAX_FIT_POINTS == 0 else f'-{size + 1}'} consecutive points (mean pass rate "
            "at the geometric mean compute; docs/fitting.md)")
    log(note)
    return (*(np.concatenate(k) for k in zip(*parts)), note)


def fit_run(store, run: dict, opts: FitOptions, refit: bool = False, log=_stderr) -> tuple[Any, bool, str]:
    """Fit a stored run (or reuse its stored fit when its points are unchanged): its validation
    points, or its evaluation series ``opts.series``, on the axis :func:`choose_axis` picks
    (a note through ``log`` when the run lacks the one asked for); only those up to step
    ``opts.until_step`` when it is set.

    Returns (:class:`scalectl.science.compare.RunCurve`, cached, key).  Raises UserError on
    input that cannot be fitted, naming the run.
    """
    import numpy as np

    from scalectl.curve import FitError, SigmoidFit, fit_sigmoid
    from scalectl.curve.solvers import MAX_FIT_POINTS
    from scalectl.science.compare import RunCurve

    if opts.method not in ("vp", "grid"):
        raise UserError(f"--method {opts.method!r} is not one of: vp, grid")
    axis = choose_axis(store, run, opts, log)
    x, y, trunc = load_points(store, run, axis, log, opts.series, opts.until_step)
    section = fit_section(run)
    min_c = fit_window(section, axis, x, opts.min_compute)
    r0 = fit_r0(section, opts.r0)
    threshold = float(section.get("truncation_threshold", TRUNCATION_THRESHOLD))
    order = np.argsort(x, kind="stable")
    fx, fy, ft, binned = thin(x[order], y[order], trunc[order], min_c, log=log, name=run["name"])
    key = (f"{axis}/{opts.method}/min={min_c:g}/r0={r0}/boot={opts.bootstrap}"
           f"/level={opts.level:g}/seed={opts.seed}/trunc={threshold:g}"
           + ("" if opts.series is None else f"/series={opts.series}")
           + ("" if opts.until_step is None else f"/until={opts.until_step}")
           + (f"/bins={MAX_FIT_POINTS}" if binned else ""))
    digest = store.points_digest(run["id"], opts.series)
    hardware = run.get("hardware") or None
    stored = None if refit else store.get_fit(run["id"], key)
    if stored is not None and stored[1] == digest:
        return RunCurve(x, y, SigmoidFit.from_dict(stored[0]), hardware), True, key
    try:
        fit = fit_sigmoid(fx, fy, min_compute=min_c, r0=parse_r0(r0), method=opts.method, axis=axis,
                          bootstrap=opts.bootstrap, level=opts.level, seed=opts.seed,
                          truncation=ft, truncation_threshold=threshold,
                          r0_se=r0_standard_error(store, run, axis, opts.series))
    except (FitError, ValueError) as exc:
        of = "" if opts.series is None else f" (series {opts.series})"
        raise UserError(f"run {run['name']!r}{of}: {exc}") from None
    store.save_fit(run["id"], key, fit.to_dict(), digest)
    return RunCurve(x, y, fit, hardware), False, key




def fit_with_draws(store, runs: list[dict], opts: FitOptions, log=_stderr) -> tuple[Any, str]:
    """Fit one stored run, or the pooled points of several runs (seeds of one recipe, whatever
    their budgets: :func:`scalectl.recipe.schema.training_key`), keeping the bootstrap draws a forecast needs; nothing is stored (a fit read back from the store
    has no draws).  The window, R0's rule and truncation threshold are the first run's
    (:func:`fit_window`, :func:`fit_r0`); the standard error of the compute-0 evaluations is used when the runs
    share one.

    Returns (:class:`scalectl.science.compare.RunCurve` of all the points, the axis).

    Raises:
        UserError: runs on different axes, runs of different recipes pooled, no points, a
            fit that fails (naming the runs), bootstrap 0.
    """
    import numpy as np

    from scalectl.curve import FitError, fit_sigmoid
    from scalectl.science.compare import RunCurve

    names = ", ".join(r["name"] for r in runs)
    if opts.bootstrap <= 0:
        raise UserError("--bootstrap must be > 0 for a forecast: its bands come from the bootstrap draws")
    from scalectl.recipe.schema import training_key

    keys = {r["name"]: training_key(r.get("recipe")) or r.get("recipe_hash") for r in runs}
    if len(runs) > 1 and len(set(keys.values())) > 1:
        which = ", ".join(f"{r['name']}: recipe {r.get('recipe_hash')}" if r.get("recipe_hash")
                          else f"{r['name']}: no recipe (imported)" for r in runs)
        raise UserError(f"runs {names} are not seeds of one recipe ({which}; budgets may differ, nothing "
                        "else): pool only the seeds of one recipe")
    axes = {r["name"]: choose_axis(store, r, opts, log) for r in runs}
    if len(set(axes.values())) > 1:
        raise UserError(f"runs {names} have values on different axes "
                        f"({', '.join(f'{n}: {a}' for n, a in axes.items())}): choose one with --axis")
    axis = next(iter(axes.values()))
    parts = [load_points(store, r, axis, log, opts.series) for r in runs]
    x, y, trunc = (np.concatenate(k) for k in zip(*parts))
    section = fit_section(runs[0])
    min_c = fit_window(section, axis, x, opts.min_compute)
    threshold = float(section.get("truncation_threshold", TRUNCATION_THRESHOLD))
    order = np.argsort(x, kind="stable")
    fx, fy, ft, _ = thin(x[order], y[order], trunc[order], min_c, log=log, name=names)
    r0 = fit_r0(section, opts.r0)
    ses = {r0_standard_error(store, r, axis, opts.series) for r in runs}
    r0_se = ses.pop() if len(ses) == 1 else None
    try:
        fit = fit_sigmoid(fx, fy, min_compute=min_c, r0=parse_r0(r0), method=opts.method, axis=axis,
                          bootstrap=opts.bootstrap, level=opts.level, seed=opts.seed,
                          truncation=ft, truncation_threshold=threshold, r0_se=r0_se)
    except (FitError, ValueError) as exc:
        raise UserError(f"run{'s' if len(runs) > 1 else ''} {names}: {exc}") from None
    hardware = {r.get("hardware") or None for r in runs}
    return RunCurve(x[order], y[order], fit, hardware.pop() if len(hardware) == 1 else None), axis
