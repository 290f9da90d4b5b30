"""The dry run's forecast: the pass rate a booking buys, from stored runs of the same recipe.

``scalectl run RECIPE --dry-run`` books a budget (:mod:`scalectl.job.booking`).  When the store
holds runs of the same recipe on the same setup, differing at most in budget and seed (their
content hashes equal once the budget is set to the planned one), their pooled points are fitted
(:func:`scalectl.science.fits.fit_with_draws`) and the pass rate is forecast at the compute the
booking buys (:func:`scalectl.science.forecast.pass_rate_at`): on GPU-hours when the recipe's
fit axis is GPU-hours and the booking has them, else on optimiser steps.
"""

from __future__ import annotations

from typing import Any, Callable

from scalectl.display import format_compute
from scalectl.errors import UserError


def same_recipe_runs(recipe, runs: list[dict]) -> list[dict]:
    """The completed runs of ``runs`` (store rows with their recipe dicts) whose recipe is
    ``recipe`` but for budget and seed (:func:`scalectl.recipe.schema.training_key`)."""
    from scalectl.recipe.schema import training_key

    want = training_key(recipe)
    return [r for r in runs if r.get("recipe") and r.get("status") == "completed" and r.get("n_points")
            and training_key(r["recipe"]) == want]


def booked_forecast(recipe, booking, store, log: Callable[[str], None] = lambda m: None) -> list[str]:
    """Lines saying what the booked budget is forecast to reach (none when the store holds no
    run of this recipe that can carry a forecast, with a line saying why when it holds some).

    Args:
        recipe: the planned :class:`scalectl.recipe.schema.Recipe`.
        booking: its :class:`scalectl.job.booking.Booking`.
        store: an open :class:`scalectl.store.database.Store`.
    """
    from scalectl.science import forecast as fc
    from scalectl.science.fits import FitOptions, fit_with_draws

    runs = same_recipe_runs(recipe, store.list_runs())
    if not runs:
        return []
    names = ", ".join(r["name"] for r in runs)
    axis = recipe.fit.axis if recipe.fit.axis == "gpu_hours" and booking.gpu_hours else "step"
    at = booking.gpu_hours if axis == "gpu_hours" else booking.steps
    if not at:
        return []
    try:
        curve, _ = fit_with_draws(store, runs, FitOptions(axis=axis), log=log)
    except UserError as exc:
        return [f"forecast: none ({exc})"]
    reasons = fc.unidentified_reasons(curve.fit)
    if reasons:
        return [f"forecast: none: the ceiling of {names} (pooled) is not identified ({'; '.join(reasons)})"]
    last = float(curve.compute.max())
    unit = "GPU-hours" if axis == "gpu_hours" else "steps"
    if at <= last:
        return [f"forecast: {names} already reach{'es' if len(runs) == 1 else ''} {format_compute(at)} {unit}"]
    (p,) = fc.pass_rate_at(curve.fit, [at], last=last)
    a = curve.fit.interval("A")
    iv = "" if a is None else f" [{a[0]:.3f}, {a[1]:.3f}]"
    return [f"forecast: pass rate {p.predicted:.3f}, {p.level:.0%} band [{p.lo:.3f}, {p.hi:.3f}] at the booked "
            f"{format_compute(at)} {unit} ({p.times_last:.3g}x the {format_compute(last)} reached), from {len(runs)} stored run(s) of "
            f"this recipe ({names}; ceiling A {curve.fit.A:.3f}{iv})"]


def forecast_lines(recipe, booking, stores: Any) -> list[str]:
    """:func:`booked_forecast` on the store ``stores()`` opens; [] when there is no store."""
    try:
        with stores() as store:
            return booked_forecast(recipe, booking, store)
    except UserError:
        return []
