"""The tables of ``scalectl fit``, ``compare`` and ``extrapolate``, as
:class:`~scalectl.display.TableData` that :func:`scalectl.present.console.print_table` draws.

Run names, the ceiling A with its interval and what a verdict rests on (dA in ``compare``)
always show; at a narrow terminal the other columns are dropped, least useful first (see
:func:`scalectl.display.fit_columns`).  Off a terminal every column is printed whole.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from scalectl.display import (
    AXIS_UNITS,
    Column,
    TableData,
    format_compute,
    format_estimate,
    format_number,
)

TITLE = "sigmoid fits R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B)"


def estimate_text(fit: Any, name: str) -> str:
    """``name`` of ``fit`` with its interval, as :func:`~scalectl.display.format_estimate` prints it."""
    return format_estimate(getattr(fit, name), fit.interval(name))


def _window(w: tuple[float, float]) -> str:
    return f"{format_compute(w[0])}-{format_compute(w[1])}"


def _flags(fit: Any) -> str:
    return ", ".join(dict.fromkeys(fit.flag_codes)) or "-"


def fit_table(named_fits: Sequence[tuple[str, Any]], axes: Sequence[str]) -> TableData:
    """One row per (name, :class:`~scalectl.curve.SigmoidFit`); ``axes`` the distinct axes."""
    cols = [Column("run", "left", keep=True), Column("axis", "left", priority=6),
            Column("window", priority=1), Column("points", priority=2),
            Column("A", keep=True), Column("B", priority=5), Column("C_mid", priority=4),
            Column("R0", priority=3), Column("rmse", priority=0),
            Column("flags", "left", priority=7)]
    one_axis = len(axes) == 1
    if one_axis:
        cols.pop(1)
    rows = []
    for name, f in named_fits:
        r0 = (estimate_text(f, "R0") if f.interval("R0") else f"{f.R0:.3f}") + (" fit" if f.r0_fitted else "")
        rows.append([name, *([] if one_axis else [f.axis]), _window(f.window), str(f.n_points),
                     estimate_text(f, "A"), estimate_text(f, "B"), estimate_text(f, "C_mid"), r0, f"{f.rmse:.4f}", _flags(f)])
    title = TITLE + (f", compute in {axes[0]}" if one_axis else "")
    return TableData(title, cols, rows)


def compare_table(result: Any, curves: dict, margin: float) -> TableData:
    """Runs of a :class:`~scalectl.science.compare.Comparison` ranked by A, with dA (the
    difference of ceilings to the baseline, with its interval: what the verdict rests on) and
    the verdict."""
    cols = [Column("#", priority=0), Column("run", "left", keep=True),
            Column("hardware", "left", priority=1), Column("A", keep=True),
            Column("B", priority=2), Column("C_mid", priority=3), Column("dA", keep=True),
            Column("verdict", "left", keep=True)]
    rows = []
    for i, row in enumerate(result.rows, 1):
        f = curves[row.name].fit
        lo, hi = row.delta_A_interval
        d = "-" if row.verdict == "baseline" else f"{row.delta_A:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        rows.append([str(i), row.name, curves[row.name].hardware or "-", estimate_text(f, "A"),
                     f"{f.B:.2f}", format_number(f.C_mid), d, row.verdict])
    return TableData(f"runs ranked by ceiling A (baseline {result.baseline}, margin {margin:.3g})", cols, rows)


def sensitivity_table(sens: Any) -> TableData:
    """Fits of one run over several windows (:class:`~scalectl.science.extrapolate.Sensitivity`)."""
    cols = [Column("window", keep=True), Column("points", priority=1), Column("A", keep=True),
            Column("B", priority=2), Column("C_mid", priority=3), Column("flags", "left", priority=4)]
    rows = []
    for row in sens.rows:
        g = row.fit
        if g is None:
            rows.append([_window(row.window), "-", "-", "-", "-", row.error or ""])
        else:
            rows.append([_window(row.window), str(g.n_points), estimate_text(g, "A"), estimate_text(g, "B"),
                         estimate_text(g, "C_mid"), _flags(g)])
    fitted = sum(r.fit is not None for r in sens.rows)
    spread = (f"A spread {sens.A_spread:.3f} over {fitted} windows" if fitted > 1 else
              f"{'one window' if fitted else 'no window'} fitted: no spread to show")
    return TableData(f"sensitivity of the fit to its window ({spread})", cols, rows)


def fit_line(name: str, fit: Any) -> str:
    """One line with a run's fitted curve: A with its interval, B, C_mid, R0 and flag codes."""
    parts = [f"{p} {estimate_text(fit, p)}" for p in ("A", "B", "C_mid")]
    r0 = estimate_text(fit, "R0") if fit.interval("R0") else f"{fit.R0:.3f}"
    return (f"fit {name} ({fit.n_points} points on {fit.axis}): " + ", ".join(parts)
            + f", R0 {r0}; flags: {_flags(fit)}")


def extrapolation_lines(name: str, axis: str, ex: Any) -> list[str]:
    """What ``extrapolate`` says about a prefix fit and its held-out points."""
    f = ex.fit
    band = ("" if ex.share_in_band is None
            else f", {ex.share_in_band:.0%} inside the {f.level:.0%} prediction band")
    return [f"{name}: fitted on {axis} <= {format_compute(ex.cut)} ({f.n_points} points): "
            + ", ".join(f"{p} {estimate_text(f, p)}" for p in ("A", "B", "C_mid")),
            f"held out {ex.heldout_compute.size} points up to "
            f"{format_compute(ex.heldout_compute.max())}: mean |error| {ex.mean_abs_error:.4f}, "
            f"max {ex.max_abs_error:.4f}{band}"]


def _times(x: float) -> str:
    return f"{x:.3g}x the last point"


def forecast_lines(curves: dict, results: dict, crossings: Sequence[Any], axis: str, horizon: float) -> list[str]:
    """What ``forecast`` says, as plain lines (nothing dropped at a narrow terminal or in a pipe).

    curves: name -> :class:`~scalectl.science.compare.RunCurve`; results: name -> {"last",
    "at": [:class:`~scalectl.science.forecast.PassRateForecast`], "reach":
    [:class:`~scalectl.science.forecast.Reach`]}; crossings: :class:`~scalectl.science.forecast.Crossing`
    of pairs of runs, on ``axis`` up to ``horizon``.  A fit with flags has them beside every number.
    """
    unit = AXIS_UNITS.get(axis, axis)
    lines = []
    for name, r in results.items():
        f = curves[name].fit
        flagged = f" [flags: {_flags(f)}]" if f.flags else ""
        lines.append(f"{name}: fitted on {axis} up to {format_compute(r['last'])} {unit} ({f.n_points} points): "
                     + ", ".join(f"{p} {estimate_text(f, p)}" for p in ("A", "B", "C_mid")) + flagged)
        for p in r["at"]:
            lines.append(f"  at {format_compute(p.compute)} {unit} ({_times(p.times_last)}): pass rate "
                         f"{p.predicted:.3f}, {p.level:.0%} band [{p.lo:.3f}, {p.hi:.3f}] (curve "
                         f"[{p.curve_lo:.3f}, {p.curve_hi:.3f}], noise sd {p.noise_sd:.3f}, drift sd "
                         f"{p.drift_sd:.3f}){flagged}")
        for x in r["reach"]:
            if not x.reachable:
                iv = "" if x.A_interval is None else f" [{x.A_interval[0]:.3f}, {x.A_interval[1]:.3f}]"
                lines.append(f"  to reach {x.target:.3f}: not reachable: the ceiling A {x.A:.3f}{iv} is at or below "
                             f"it (in {x.p_ceiling_below:.0%} of the bootstrap draws){flagged}")
                continue
            hi = "never" if not math.isfinite(x.hi) else format_compute(x.hi)
            where = ("already measured" if x.reached else _times(x.times_last))
            risk = (f"; the ceiling is at or below it in {x.p_ceiling_below:.0%} of the bootstrap draws"
                    if x.p_ceiling_below > 0 else "")
            lines.append(f"  to reach {x.target:.3f}: {format_compute(x.compute)} {unit} "
                         f"[{format_compute(x.lo)}, {hi}] ({where}){risk}{flagged}")
    if crossings:
        lines.append(f"crossings from {format_compute(crossings[0].start)} {unit} (the compute every run reached) "
                     f"up to {format_compute(horizon)}:")
    for c in crossings:
        share = "" if c.probability is None else f"{c.probability:.0%} of the bootstrap draws"
        if c.compute is None:
            lines.append(f"  {c.first} and {c.second} do not cross"
                         + (f" ({share} do)" if share else "") + f": {c.leader_before} leads throughout")
            continue
        iv = "" if c.lo is None else f" [{format_compute(c.lo)}, {format_compute(c.hi)}]"
        twice = (f" (the curves cross {c.crossings} times on this range; {c.leader_at_horizon} leads at "
                 f"{format_compute(c.horizon)} {unit})" if c.crossings > 1 else "")
        lines.append(f"  {c.first} and {c.second} cross at {format_compute(c.compute)} {unit}{iv}"
                     + (f" (in {share} within the horizon)" if share else "")
                     + f": {c.leader_before} leads before, {c.leader_after} after{twice}")
    return lines
