"""The answer at the end of ``scalectl run``: the finished run's fitted curve, its flags,
the advice line, and a plot of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalectl.defaults import MARGIN
from scalectl.errors import UserError


def summarize_run(store, run_id: int, plot: Path, margin: float = MARGIN) -> tuple[list[str], dict[str, Any]]:
    """Fit a stored run (:func:`scalectl.science.fits.fit_run`, default settings), draw it
    to ``plot`` (points, curve, ceiling with its interval, +-``margin`` band) and say
    what came out.

    The advice (:func:`scalectl.curve.advise`) is in steps, device-hours and wall-clock at
    the run's measured rate (:func:`scalectl.curve.step_rate` of its points).

    When the advice is to extend, a line gives the command that does it (``scalectl run
    --resume NAME --set budget.steps=N``).

    Returns (lines for people, JSON-ready {"fit", "advice", "plot"}).  A run that
    cannot be fitted yet (too few points) gives one line and {"error": why}; no
    exception, the run itself succeeded.
    """
    from scalectl.present.tables import fit_line
    from scalectl.science.fits import FitOptions, fit_run

    run = store.get_run(str(run_id))
    try:
        curve = fit_run(store, run, FitOptions())[0]
    except UserError as exc:
        return [f"fit: not yet possible: {exc}"], {"error": str(exc)}
    from scalectl.curve import advise, step_rate
    from scalectl.present.plot import plot_curves

    f = curve.fit
    path = plot_curves({run["name"]: curve}, plot, baseline=run["name"], margin=margin)
    lines = [fit_line(run["name"], f)] + [f"{run['name']} {fl.code}: {fl.message}" for fl in f.flags]
    rate = step_rate(store.points(run["id"]), f.axis, source=run["name"])
    advice = advise(f, margin, rate=rate) if f.interval("A") else None
    if advice is not None:
        lines.append(f"advice: {advice.message}")
        if advice.action == "extend" and advice.steps and rate is not None:
            lines.append(f"extend it: scalectl run --resume {run['name']} "
                         f"--set budget.steps={rate.last_step + advice.steps}")
    lines.append(f"plot: {path}")
    return lines, {"fit": f.to_dict(), "advice": None if advice is None else advice.message,
                   "plot": str(path)}
