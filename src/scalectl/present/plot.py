"""Figures: scaling curves of several runs, an extrapolation check, a forecast past the points,
leave-one-out lines, truncation rates.

Every figure has the style of :mod:`scalectl.present.style` (one colour per run,
compute axes in the run's units, pass-rate limits from the data and the identified
ceilings, the step-0 point at the left edge, the legend inside the figure).  The format
follows the file extension, ``.png`` or ``.svg`` (SVG keeps its text as text).  The
``plot_*`` functions return the path they wrote; the ``*_figure`` functions the figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from scalectl.curve import SigmoidFit
from scalectl.defaults import MARGIN, TRUNCATION_THRESHOLD
from scalectl.display import format_compute, format_estimate, format_number
from scalectl.present import style
from scalectl.science.compare import LooLine, RunCurve
from scalectl.science.extrapolate import Extrapolation

AXIS_LABELS = style.AXIS_LABELS
FORMATS = style.FORMATS


def a_on_bound(fit: SigmoidFit) -> bool:
    """Whether the fit's ceiling A lies on its bound (an ``on_bound`` flag on A): then it is
    not a ceiling the data show, and is drawn as a bound, not as a ceiling."""
    return any(f.code == "on_bound" and f.param == "A" for f in fit.flags)


def identified(fit: SigmoidFit) -> bool:
    """Whether the fit's ceiling is one the data show: not on its bound and not flagged
    ``ceiling_not_identified``.  Only those set the limits of a pass-rate axis."""
    return not a_on_bound(fit) and not fit.has_flag("ceiling_not_identified")


def _label(name: str, fit: SigmoidFit) -> str:
    a = format_estimate(fit.A, fit.interval("A"))
    text = f"{name}: A {a}" + (" (on its bound)" if a_on_bound(fit) else "")
    text += f", B {fit.B:.2f}, C_mid {format_number(fit.C_mid, 2)}"
    if fit.flags:
        text += "  [" + ", ".join(dict.fromkeys(fit.flag_codes)) + "]"
    return text


def _run_handle(color: str) -> Line2D:
    return Line2D([], [], color=color, lw=2, marker="o", ms=4)


def plot_curves(runs: Mapping[str, RunCurve], path: str | Path, *, baseline: str | None = None,
                margin: float = MARGIN, title: str | None = None) -> Path:
    """Write :func:`curves_figure` to ``path`` (.png or .svg) and return the path.  Raises
    ValueError as :func:`curves_figure` does, and on an unsupported extension."""
    return style.save(curves_figure(runs, baseline=baseline, margin=margin, title=title), path)


def curves_figure(runs: Mapping[str, RunCurve], *, baseline: str | None = None,
                  margin: float = MARGIN, title: str | None = None) -> Figure:
    """Pass rate against compute (log axis, the fit's units) for several runs.

    Per run, in its own colour: the points (hollow below the fit window; those at compute
    0 as diamonds at the left edge), the fitted curve, its ceiling A as a dashed line
    (dotted when the fit flags it ``ceiling_not_identified``, none when A lies on its
    bound) and, in a strip right of the axes, the interval of A as a bar (one slot per
    run, so that intervals never blur into one another).  A grey band of +-``margin``
    around the baseline's ceiling.  The y limits hold the points, the curves and the
    identified ceilings with their intervals (:func:`identified`); the interval of a ceiling
    that is not identified runs to the edge and ends in an arrow, and such a ceiling above the
    axes is written at their top left with its interval.  The legend (below the axes) gives A
    with its interval, B, C_mid and each fit's flag codes.

    Raises:
        ValueError: an empty mapping, an unknown baseline, or no point with compute > 0.
    """
    if not runs:
        raise ValueError("plot_curves needs at least one run")
    if baseline is not None and baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the plotted runs: {list(runs)}")
    fig = style.new_figure()
    ax, strip = style.axes_with_strip(fig, len(runs))
    xs = {n: np.asarray(c.compute, dtype=float) for n, c in runs.items()}
    ys = {n: np.asarray(c.pass_rate, dtype=float) for n, c in runs.items()}
    lo, hi = style.positive_range(xs.values())
    zero = any((x == 0).any() for x in xs.values())
    end = hi * 1.5
    axis = next(iter(runs.values())).fit.axis
    style.compute_axis(ax, axis, lo, end, zero_edge=zero)
    grid = np.geomspace(ax.get_xlim()[0], end, 400)
    curves = {n: c.fit.predict(grid) for n, c in runs.items()}
    shown = [*np.concatenate(list(ys.values())), *np.concatenate(list(curves.values()))]
    # an identified ceiling with its whole interval: the interval bars are then drawn whole
    shown += [v for c in runs.values() if identified(c.fit) for v in (c.fit.A, *(c.fit.interval("A") or ()))]
    if baseline is not None and identified(runs[baseline].fit):
        shown += [runs[baseline].fit.A - margin, runs[baseline].fit.A + margin]
    style.pass_rate_axis(ax, style.pass_rate_limits(shown))
    handles, labels = [], []
    if baseline is not None:
        a = runs[baseline].fit.A
        # a pass rate lies in [0, 1]: the band stops there (A at 1 draws only its lower half)
        for where in (ax, strip):
            where.axhspan(max(a - margin, 0.0), min(a + margin, 1.0), color="grey", alpha=0.18, lw=0,
                          label=f"{baseline} ceiling +-{margin:g}")
    for i, (name, cur) in enumerate(runs.items()):
        c, x, y, fit = style.color(i), xs[name], ys[name], cur.fit
        inside = (x >= fit.window[0]) & (x > 0)
        early = (x > 0) & ~inside
        ax.scatter(x[inside], y[inside], s=14, color=c, alpha=0.85, zorder=3, lw=0)
        ax.scatter(x[early], y[early], s=16, facecolors="none", edgecolors=c, alpha=0.7, zorder=3)
        style.draw_compute_zero(ax, y[x == 0], c)
        ax.plot(grid, curves[name], color=c, lw=2, zorder=2)
        if not a_on_bound(fit):
            for where in (ax, strip):
                where.axhline(fit.A, color=c, lw=1, alpha=0.8,
                              ls=":" if fit.has_flag("ceiling_not_identified") else "--")
        iv = fit.interval("A")
        style.interval_bar(strip, i, fit.A, iv if iv is not None else (fit.A, fit.A), c)
        handles.append(_run_handle(c))
        labels.append(_label(name, fit))
    strip.set_xlabel(f"A, {next(iter(runs.values())).fit.level:.0%}\ninterval", fontsize=8)
    _ceilings_above(ax, runs)
    handles, labels = _curve_notes(ax, runs, xs, baseline, margin, handles, labels)
    style.set_title(ax, title or "Pass rate against compute: points, fitted sigmoids, ceilings A"
                    + _warnings(runs), loc="left")
    style.legend_below(fig, ax, handles, labels)
    return fig


def _curve_notes(ax, runs, xs, baseline, margin, handles, labels):
    """The legend's key to the marks: ceilings, interval bars, the margin band, hollow and
    step-0 points (those the figure has)."""
    level = next(iter(runs.values())).fit.level
    handles.append(Line2D([], [], color="grey", lw=1, ls="--"))
    labels.append("ceiling A (dotted: not identified; none: A on its bound)")
    handles.append(Line2D([], [], color="grey", lw=2.2, marker="_", ms=9, mew=2.2))
    labels.append(f"bars at the right: {level:.0%} interval of A (arrow: it goes on)")
    if baseline is not None:
        handles.append(Patch(color="grey", alpha=0.18, lw=0))
        labels.append(f"{baseline} ceiling +-{margin:g}" + _off_axes(ax, runs[baseline].fit.A, margin))
    if any(((x > 0) & (x < c.fit.window[0])).any() for x, c in zip(xs.values(), runs.values())):
        handles.append(Line2D([], [], ls="", marker="o", ms=4, mfc="none", color="grey"))
        labels.append("hollow: before the fit window")
    if any((x == 0).any() for x in xs.values()):
        handles.append(Line2D([], [], ls="", marker="D", ms=5, mfc="white", color="grey"))
        labels.append("diamonds at the left edge: compute 0 (step 0)")
    return handles, labels


def _ceilings_above(ax, runs: Mapping[str, RunCurve]) -> None:
    """Write, at the top left inside the axes, each ceiling that lies above them (one the data do
    not identify, which the y limits leave out) with its interval, in its run's colour: the
    figure shows where it is instead of an arrow alone."""
    y1 = ax.get_ylim()[1]
    lines = []
    for i, (name, cur) in enumerate(runs.items()):
        fit = cur.fit
        if fit.A > y1:
            why = "on its bound" if a_on_bound(fit) else "not identified: extend the run"
            lines.append((f"{name}: ceiling A {format_estimate(fit.A, fit.interval('A'))} lies above the axes ({why})",
                          style.color(i)))
    for k, (text, c) in enumerate(lines):
        ax.annotate(text, (0.01, 0.98), xycoords="axes fraction", xytext=(0, -11 * k), textcoords="offset points",
                    ha="left", va="top", fontsize=7.5, color=c, zorder=7)


def _off_axes(ax, a: float, margin: float) -> str:
    """'' when the band ``a +- margin`` crosses the y limits of ``ax``, else where it lies
    (the limits leave out a ceiling that is not identified, and its band with it)."""
    y0, y1 = ax.get_ylim()
    if a - margin > y1:
        return f" (above the axes, at {a:.2f})"
    if a + margin < y0:
        return f" (below the axes, at {a:.2f})"
    return ""


def _warnings(runs: Mapping[str, RunCurve]) -> str:
    hardware = sorted({c.hardware for c in runs.values() if c.hardware})
    axes = sorted({c.fit.axis for c in runs.values()})
    warn = []
    if len(hardware) > 1:
        warn.append(f"mixed hardware: {', '.join(hardware)}")
    if len(axes) > 1:
        warn.append(f"mixed compute axes: {', '.join(axes)}")
    return "\n[" + "; ".join(warn) + ": not comparable]" if warn else ""


def plot_extrapolation(ex: Extrapolation, path: str | Path, *, name: str = "run",
                       fitted_compute: Sequence[float] | None = None,
                       fitted_pass_rate: Sequence[float] | None = None,
                       title: str | None = None) -> Path:
    """Write :func:`extrapolation_figure` to ``path`` and return the path."""
    return style.save(extrapolation_figure(ex, name=name, fitted_compute=fitted_compute,
                                           fitted_pass_rate=fitted_pass_rate, title=title), path)


def extrapolation_figure(ex: Extrapolation, *, name: str = "run",
                         fitted_compute: Sequence[float] | None = None,
                         fitted_pass_rate: Sequence[float] | None = None,
                         title: str | None = None) -> Figure:
    """A prefix fit (solid), its prediction past the cut (dashed, with its band), the held-out points.

    ``fitted_compute``/``fitted_pass_rate``: the points the fit used (drawn filled; one at
    compute 0 as a diamond at the left edge); the held-out points come from ``ex`` (drawn
    hollow).  The title gives the mean and max absolute error and the share of held-out
    points inside the band.
    """
    fit = ex.fit
    fig = style.new_figure()
    ax = style.new_axes(fig)
    hx, hy = np.asarray(ex.heldout_compute, dtype=float), np.asarray(ex.heldout_pass_rate, dtype=float)
    fx = np.asarray(fitted_compute if fitted_compute is not None else [], dtype=float)
    fy = np.asarray(fitted_pass_rate if fitted_pass_rate is not None else [], dtype=float)
    lo, hi = style.positive_range([hx, fx, np.array([fit.window[0]])])
    style.compute_axis(ax, fit.axis, lo, hi * 1.2, zero_edge=bool((fx == 0).any()))
    before = np.geomspace(ax.get_xlim()[0], ex.cut, 200)
    after = np.geomspace(ex.cut, hi * 1.2, 200)
    band = None
    if fit.samples is not None and len(fit.samples):
        band = fit.band(after, kind="prediction", drift_sd=ex.drift_sd)
    shown = [*fy, *hy, *fit.predict(before), *fit.predict(after)]
    shown += [] if band is None else [*band[0], *band[1]]
    shown += [fit.A] if identified(fit) else []
    style.pass_rate_axis(ax, style.pass_rate_limits(shown))
    c = style.color(0)
    if fx.size:
        ax.scatter(fx[fx > 0], fy[fx > 0], s=14, color=c, label="points fitted", zorder=3, lw=0)
        style.draw_compute_zero(ax, fy[fx == 0], c, label="compute 0 (step 0), at the left edge"
                                if (fx == 0).any() else None)
    ax.scatter(hx, hy, s=22, facecolors="none", edgecolors="black", label="held-out points", zorder=3)
    ax.plot(before, fit.predict(before), color=c, lw=2, label=_label(name, fit))
    ax.plot(after, fit.predict(after), color=c, lw=2, ls="--", label="prediction")
    if band is not None:
        ax.fill_between(after, band[0], band[1], color=c, alpha=0.15, lw=0,
                        label=f"{fit.level:.0%} prediction band")
    # the cut as `scalectl extrapolate` prints it (format_compute): the same number, not a rounder one
    cut = f"{format_compute(ex.cut)} {style.AXIS_UNITS.get(fit.axis, fit.axis)}"
    ax.axvline(ex.cut, color="grey", ls=":", lw=1, label=f"cut at {cut}")
    if not a_on_bound(fit):
        ax.axhline(fit.A, color=c, ls="--", lw=0.8, alpha=0.6)
    inside = "" if ex.share_in_band is None else f", {ex.share_in_band:.0%} inside band"
    style.set_title(ax, title or f"{name}: fitted on compute <= {cut}, held-out error "
                                 f"mean {ex.mean_abs_error:.3f} / max {ex.max_abs_error:.3f}{inside}")
    style.legend_below(fig, ax)
    return fig


def plot_forecast(runs: Mapping[str, RunCurve], path: str | Path, *, horizon: float,
                  targets: Sequence[float] = (), drift_sd: float = 0.01,
                  reaches: Mapping[str, Sequence] | None = None, crossings: Sequence = (),
                  title: str | None = None) -> Path:
    """Write :func:`forecast_figure` to ``path`` (.png or .svg) and return the path."""
    return style.save(forecast_figure(runs, horizon=horizon, targets=targets, drift_sd=drift_sd,
                                      reaches=reaches, crossings=crossings, title=title), path)


def forecast_figure(runs: Mapping[str, RunCurve], *, horizon: float, targets: Sequence[float] = (),
                    drift_sd: float = 0.01, reaches: Mapping[str, Sequence] | None = None,
                    crossings: Sequence = (), title: str | None = None) -> Figure:
    """Curves drawn beyond their data: per run, in its own colour, the points, the fitted curve
    (solid over the points, dashed from the last point to ``horizon``, compute in the fit's
    units) with its prediction band past the last point (:meth:`SigmoidFit.band` with
    ``drift_sd``), the last measured point ringed, and the identified ceiling A as a thin dashed
    line.  ``targets``: pass rates drawn as grey horizontal lines; ``reaches`` (name ->
    :class:`~scalectl.science.forecast.Reach` per target) marks where each curve reaches one,
    with its interval as a horizontal bar.  ``crossings``
    (:class:`~scalectl.science.forecast.Crossing`): each crossing of two curves as a black cross,
    its interval as a thin black bar.

    Raises:
        ValueError: an empty mapping, no point with compute > 0, or ``horizon`` not beyond
            every run's last point.
    """
    if not runs:
        raise ValueError("plot_forecast needs at least one run")
    xs = {n: np.asarray(c.compute, dtype=float) for n, c in runs.items()}
    ys = {n: np.asarray(c.pass_rate, dtype=float) for n, c in runs.items()}
    lo, last_all = style.positive_range(xs.values())
    if not horizon > last_all:
        raise ValueError(f"the horizon {horizon:g} is not beyond the last point at {last_all:g}")
    fig = style.new_figure()
    ax = style.new_axes(fig)
    axis = next(iter(runs.values())).fit.axis
    style.compute_axis(ax, axis, lo, horizon, zero_edge=any((x == 0).any() for x in xs.values()))
    left = ax.get_xlim()[0]
    drawn, shown = {}, [*targets]
    for name, cur in runs.items():
        last = float(xs[name].max())
        inside, after = np.geomspace(left, last, 200), np.geomspace(last, horizon, 200)
        band = cur.fit.band(after, kind="prediction", drift_sd=drift_sd) \
            if cur.fit.samples is not None and len(cur.fit.samples) else None
        drawn[name] = (last, inside, after, band)
        shown += [*ys[name], *cur.fit.predict(inside), *cur.fit.predict(after)]
        shown += [] if band is None else [*band[0], *band[1]]
        shown += [cur.fit.A] if identified(cur.fit) else []
    style.pass_rate_axis(ax, style.pass_rate_limits(shown))
    handles, labels = [], []
    for i, (name, cur) in enumerate(runs.items()):
        c, fit = style.color(i), cur.fit
        last, inside, after, band = drawn[name]
        x, y = xs[name], ys[name]
        ax.scatter(x[x > 0], y[x > 0], s=12, color=c, alpha=0.8, zorder=3, lw=0)
        style.draw_compute_zero(ax, y[x == 0], c)
        ax.plot(inside, fit.predict(inside), color=c, lw=2, zorder=2)
        ax.plot(after, fit.predict(after), color=c, lw=2, ls="--", zorder=2)
        if band is not None:
            ax.fill_between(after, band[0], band[1], color=c, alpha=0.15, lw=0)
        j = int(np.argmax(x))
        ax.scatter([x[j]], [y[j]], s=90, facecolors="none", edgecolors="black", linewidths=1.4, zorder=4)
        if identified(fit):
            ax.axhline(fit.A, color=c, lw=0.8, ls=(0, (2, 3)), alpha=0.7)
        for r in (reaches or {}).get(name, ()):
            if r.reachable and left < r.compute <= horizon:
                hi = min(r.hi, horizon) if np.isfinite(r.hi) else horizon
                ax.plot([max(r.lo, left), hi], [r.target, r.target], color=c, lw=3, alpha=0.5, zorder=4,
                        solid_capstyle="butt")
                ax.plot([r.compute], [r.target], marker="|", ms=12, mew=2, color=c, zorder=5)
        handles.append(_run_handle(c))
        labels.append(_label(name, fit))
    for t in targets:
        ax.axhline(t, color="grey", lw=1, ls="-.", alpha=0.8)
    crossed = [c for c in crossings if c.compute is not None and c.first in runs]
    for c in crossed:
        y = float(runs[c.first].fit.predict(c.compute))
        if c.lo is not None:
            ax.plot([max(c.lo, left), min(c.hi, horizon)], [y, y], color="black", lw=1, zorder=5)
        ax.plot([c.compute], [y], marker="x", ms=9, mew=2, color="black", zorder=6)
    handles += [Line2D([], [], color="black", lw=2, ls="--"), Patch(color="grey", alpha=0.3),
                Line2D([], [], ls="none", marker="o", ms=9, mfc="none", mec="black")]
    band_level = next(iter(runs.values())).fit.level
    labels += ["forecast (dashed): the fitted curve past the last point",
               f"{band_level:.0%} prediction band (fit, evaluation noise, drift sd {drift_sd:g})",
               "last measured point"]
    if targets:
        handles.append(Line2D([], [], color="grey", lw=1, ls="-.", marker="|", ms=10, mew=2))
        labels.append("target pass rate; where each curve reaches it, with its interval")
    if crossed:
        handles.append(Line2D([], [], color="black", lw=1, marker="x", ms=8, mew=2))
        labels.append("where two curves cross, with its interval")
    style.set_title(ax, title or f"Forecast to {style.compute_text(horizon, axis)}: "
                    "fitted curves drawn past their points", loc="left")
    style.legend_below(fig, ax, handles, labels)
    return fig


def plot_loo(lines: Sequence[LooLine], path: str | Path, *, axis: str = "gpu_hours",
             fits: Mapping[str, SigmoidFit] | None = None, title: str | None = None,
             margin: float | None = None) -> Path:
    """Write :func:`loo_figure` to ``path`` and return the path."""
    return style.save(loo_figure(lines, axis=axis, fits=fits, title=title, margin=margin), path)


def loo_figure(lines: Sequence[LooLine], *, axis: str = "gpu_hours",
               fits: Mapping[str, SigmoidFit] | None = None, title: str | None = None,
               margin: float | None = None) -> Figure:
    """Leave-one-out lines: each run refitted with its ceiling A fixed, linearised.

    With A and R0 fixed the sigmoid is (R - R0) / (A - R) = (C / C_mid)^B, a straight line
    of slope B on log-log axes that crosses 1 at C = C_mid (Khatri et al. 2025, section 4).
    Both axes are logarithmic in their own units: compute in the run's units, the ratio
    as a plain number.  Points from :func:`scalectl.science.compare.loo_lines`: one shared A,
    or (where the runs' ceilings differ by more than ``margin``) each run's own A, which the
    title then says with the spread of the ceilings.  The legend gives each run's B and C_mid
    with its A, and, from ``fits`` (name -> the run's own fit), its own A and B: the two differ
    when a shared A is not the run's ceiling.

    Raises:
        ValueError: no line, or no point with compute > 0.
    """
    if not lines:
        raise ValueError("plot_loo needs at least one line")
    fig = style.new_figure()
    ax = style.new_axes(fig)
    cs = [np.exp(ln.log_c) for ln in lines]
    odds = [np.exp(ln.log_f - ln.B * np.log(ln.C_mid)) for ln in lines]
    lo, hi = style.positive_range(cs)
    style.compute_axis(ax, axis, lo, hi)
    shared = len({ln.A for ln in lines}) == 1
    for i, (ln, c, o) in enumerate(zip(lines, cs, odds)):
        col = style.color(i)
        ax.scatter(c, o, s=14, color=col, alpha=0.85, lw=0, zorder=3)
        label = f"{ln.name}: B {ln.B:.2f}, C_mid {format_number(ln.C_mid, 3)} " + (
            "with A shared" if shared else f"with its own A {ln.A:.3f}")
        own = (fits or {}).get(ln.name)
        if own is not None and shared:
            label += f" (own fit: A {own.A:.3f}, B {own.B:.2f})"
        if c.size:
            xs = np.geomspace(c.min(), c.max(), 50)
            ax.plot(xs, (xs / ln.C_mid) ** ln.B, color=col, lw=2, label=label)
    ax.set_yscale("log")
    o_lo, o_hi = style.positive_range(odds)
    style.log_ticks(ax.yaxis, o_lo, o_hi)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="ratio 1: compute = C_mid")
    style.set_ylabel(ax, "(R - R0) / (A - R), A shared" if shared else "(R - R0) / (A - R), each run's own A")
    if shared:
        default = (f"Runs refitted with one shared ceiling A = {lines[0].A:.3f}: slope = B\n"
                   "(with A shared, B differs from a run's own fit when its ceiling differs)")
    else:
        a = [ln.A for ln in lines]
        beyond = "the margin" if margin is None else f"the margin {margin:g}"
        default = (f"Runs linearised each with its own ceiling A: slope = B\n(their ceilings differ by "
                   f"{max(a) - min(a):.3f}, {min(a):.3f} to {max(a):.3f}, more than {beyond}: one shared A "
                   "would change their B)")
    style.set_title(ax, title or default)
    style.legend_below(fig, ax, max_cols=1)
    return fig


def plot_truncation(series: dict[str, list[tuple[np.ndarray, np.ndarray]]], path: str | Path, *,
                    axis: str = "gpu_hours", threshold: float = TRUNCATION_THRESHOLD) -> Path:
    """Write :func:`truncation_figure` to ``path`` and return the path."""
    return style.save(truncation_figure(series, axis=axis, threshold=threshold), path)


def truncation_figure(series: dict[str, list[tuple[np.ndarray, np.ndarray]]], *,
                      axis: str = "gpu_hours", threshold: float = TRUNCATION_THRESHOLD) -> Figure:
    """Truncation rate (share of completions cut at the length limit) against compute,
    one colour per variant (one line per seed), with the flag threshold (docs/method.md,
    section 5: runs past 10-15 % became unstable).  Points at compute 0 (step 0) are
    drawn as hollow diamonds at the left edge of the log axis, as in :func:`curves_figure`.

    Raises:
        ValueError: no finite rate at compute > 0.
    """
    fig = style.new_figure((7.5, 4.0))
    ax = style.new_axes(fig)
    finite = [x[np.isfinite(t) & (x > 0)] for runs in series.values() for x, t in runs]
    lo, hi = style.positive_range(finite)
    zero = any((np.isfinite(t) & (x == 0)).any() for runs in series.values() for x, t in runs)
    style.compute_axis(ax, axis, lo, hi, zero_edge=zero)
    top = threshold
    for i, (name, runs) in enumerate(series.items()):
        col = style.color(i)
        for j, (x, t) in enumerate(runs):
            ok = np.isfinite(t) & (x > 0)
            at_zero = np.isfinite(t) & (x == 0)
            if (ok | at_zero).any():
                top = max(top, float(np.max(t[ok | at_zero])))
            ax.plot(x[ok], t[ok], "o-", ms=3, lw=1.2, color=col, alpha=0.85, label=name if j == 0 else None)
            style.draw_compute_zero(ax, t[at_zero], col)
    ax.axhline(threshold, color="black", ls=":", lw=1, label=f"flag threshold {threshold:g}")
    if zero:
        ax.scatter([], [], marker="D", s=26, facecolors="white", edgecolors="grey",
                   label="diamonds at the left edge: compute 0 (step 0)")
    ax.set_ylim(0, min(1.0, 1.15 * top))
    style.set_ylabel(ax, "truncation rate")
    style.set_title(ax, "Truncation rate against compute")
    style.legend_below(fig, ax)
    return fig
