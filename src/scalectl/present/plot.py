"""Figures: scaling curves of several runs, an extrapolation check, leave-one-out lines.

Matplotlib's object API on the Agg canvas (no pyplot, no global state); the
format follows the file extension, ``.png`` or ``.svg`` (SVG keeps its text as
text).  Every function returns the path it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scalectl.curve import SigmoidFit
from scalectl.defaults import MARGIN, TRUNCATION_THRESHOLD
from scalectl.display import format_estimate, format_number
from scalectl.science.compare import LooLine, RunCurve
from scalectl.science.extrapolate import Extrapolation

AXIS_LABELS = {
    "gpu_hours": "training compute (GPU-hours)",
    "flops": "training compute (FLOPs)",
    "tokens": "tokens trained",
    "step": "training steps",
}
FORMATS = (".png", ".svg")
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22"]


def _new_figure(size: tuple[float, float] = (7.5, 5.0)) -> Figure:
    fig = Figure(figsize=size, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"plot file {str(path)!r}: extension {path.suffix or '(none)'!r} is not "
                         f"one of {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(path, dpi=fig.dpi)
    return path


def _log_x(ax) -> None:
    """A log compute axis whose labels do not overlap: over two decades or more only the
    powers of 10 are labelled; over less, the 2 and 5 multiples as well (matplotlib's own
    choice on short spans labels 2, 3, 4, 6 x 10^k, which run into each other)."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter

    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    if lo > 0 and hi / lo >= 100:
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.xaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False,
                                                             minor_thresholds=(np.inf, np.inf)))


def _label(name: str, fit: SigmoidFit) -> str:
    a = format_estimate(fit.A, fit.interval("A"))
    text = f"{name}: A {a}, B {fit.B:.2f}, C_mid {format_number(fit.C_mid, 2)}"
    if fit.flags:
        text += "  [" + ", ".join(dict.fromkeys(fit.flag_codes)) + "]"
    return text


def _positive_range(xs: Sequence[np.ndarray]) -> tuple[float, float]:
    pos = np.concatenate([x[x > 0] for x in xs])
    return float(pos.min()), float(pos.max())


def plot_curves(runs: Mapping[str, RunCurve], path: str | Path, *, baseline: str | None = None,
                margin: float = MARGIN, title: str | None = None) -> Path:
    """Write :func:`curves_figure` to ``path`` (.png or .svg) and return the path.  Raises
    ValueError as :func:`curves_figure` does, and on an unsupported extension."""
    return _save(curves_figure(runs, baseline=baseline, margin=margin, title=title), path)


def curves_figure(runs: Mapping[str, RunCurve], *, baseline: str | None = None,
                  margin: float = MARGIN, title: str | None = None) -> Figure:
    """Pass rate against compute (log axis) for several runs.

    Points (faded below the fit window), fitted curves, dashed ceilings A with
    their intervals shaded, and a band of +-``margin`` around the baseline's ceiling.  The legend gives A (with
    its interval), B, C_mid and each fit's flag codes.  Points at compute 0 cannot
    sit on a log axis and are left out (R0 is in the fit).  The legend sits below
    the axes, where it covers no point.  Raises ValueError on an empty mapping or an
    unknown baseline.
    """
    if not runs:
        raise ValueError("plot_curves needs at least one run")
    if baseline is not None and baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the plotted runs: {list(runs)}")
    fig = _new_figure()
    ax = fig.add_subplot()
    lo, hi = _positive_range([np.asarray(c.compute, dtype=float) for c in runs.values()])
    grid = np.geomspace(lo, hi * 1.5, 300)
    for i, (name, cur) in enumerate(runs.items()):
        color = _COLORS[i % len(_COLORS)]
        x = np.asarray(cur.compute, dtype=float)
        y = np.asarray(cur.pass_rate, dtype=float)
        inside = (x >= cur.fit.window[0]) & (x > 0)
        ax.scatter(x[inside], y[inside], s=14, color=color, alpha=0.8, zorder=3)
        early = (x > 0) & ~inside
        ax.scatter(x[early], y[early], s=14, facecolors="none", edgecolors=color, alpha=0.5)
        ax.plot(grid, cur.fit.predict(grid), color=color, lw=2, label=_label(name, cur.fit))
        ax.axhline(cur.fit.A, color=color, ls="--", lw=1)
        iv = cur.fit.interval("A")
        if iv is not None:
            ax.axhspan(iv[0], iv[1], color=color, alpha=0.12, lw=0,
                       label=f"{name}: {cur.fit.level:.0%} interval of A")
    if baseline is not None:
        a = runs[baseline].fit.A
        # A pass rate lies in [0, 1]: the band stops there (A at 1 draws only its lower half).
        ax.axhspan(max(a - margin, 0.0), min(a + margin, 1.0), color="grey", alpha=0.15, lw=0,
                   label=f"{baseline} ceiling +-{margin:g}")
    axis = next(iter(runs.values())).fit.axis
    _log_x(ax)
    ax.set_xlabel(AXIS_LABELS.get(axis, axis))
    ax.set_ylabel("pass rate (mean@k)")
    hardware = sorted({c.hardware for c in runs.values() if c.hardware})
    axes = sorted({c.fit.axis for c in runs.values()})
    warn = []
    if len(hardware) > 1:
        warn.append(f"mixed hardware: {', '.join(hardware)}")
    if len(axes) > 1:
        warn.append(f"mixed compute axes: {', '.join(axes)}")
    ax.set_title(title or "Pass rate against compute, fitted sigmoid (dashed: ceiling A)"
                 + ("\n[" + "; ".join(warn) + ": not comparable]" if warn else ""))
    ax.grid(True, which="both", alpha=0.3)
    _legend_below(fig, ax)
    return fig


def _legend_below(fig: Figure, ax) -> None:
    # Below the axes, not over them: a run's points and curve can fill any corner.
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", fontsize=8,
               ncol=1 if len(labels) <= 4 else 2, frameon=False)


def plot_extrapolation(ex: Extrapolation, path: str | Path, *, name: str = "run",
                       fitted_compute: Sequence[float] | None = None,
                       fitted_pass_rate: Sequence[float] | None = None,
                       title: str | None = None) -> Path:
    """A prefix fit (solid), its prediction past the cut (dashed, with band), held-out points.

    ``fitted_compute``/``fitted_pass_rate``: the points the fit used (drawn filled);
    the held-out points come from ``ex`` (drawn hollow).  The title gives the mean
    and max absolute error and the share of held-out points inside the band.
    """
    fit = ex.fit
    fig = _new_figure()
    ax = fig.add_subplot()
    hx = np.asarray(ex.heldout_compute, dtype=float)
    fx = np.asarray(fitted_compute if fitted_compute is not None else [], dtype=float)
    fy = np.asarray(fitted_pass_rate if fitted_pass_rate is not None else [], dtype=float)
    lo, hi = _positive_range([hx, fx, np.array([fit.window[0]])])
    before = np.geomspace(lo, ex.cut, 150)
    after = np.geomspace(ex.cut, hi * 1.2, 150)
    color = _COLORS[0]
    if fx.size:
        ax.scatter(fx[fx > 0], fy[fx > 0], s=14, color=color, label="points fitted", zorder=3)
    ax.scatter(hx, ex.heldout_pass_rate, s=22, facecolors="none", edgecolors="black",
               label="held-out points", zorder=3)
    ax.plot(before, fit.predict(before), color=color, lw=2, label=_label(name, fit))
    ax.plot(after, fit.predict(after), color=color, lw=2, ls="--", label="prediction")
    if fit.samples is not None and len(fit.samples):
        b_lo, b_hi = fit.band(after, kind="prediction", drift_sd=ex.drift_sd)
        ax.fill_between(after, b_lo, b_hi, color=color, alpha=0.15, lw=0,
                        label=f"{fit.level:.0%} prediction band")
    ax.axvline(ex.cut, color="grey", ls=":", lw=1)
    ax.axhline(fit.A, color=color, ls="--", lw=0.8, alpha=0.6)
    _log_x(ax)
    ax.set_xlabel(AXIS_LABELS.get(fit.axis, fit.axis))
    ax.set_ylabel("pass rate (mean@k)")
    inside = "" if ex.share_in_band is None else f", {ex.share_in_band:.0%} inside band"
    ax.set_title(title or f"{name}: fitted to {ex.cut:.4g}, held-out error mean "
                          f"{ex.mean_abs_error:.3f} / max {ex.max_abs_error:.3f}{inside}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    _legend_below(fig, ax)
    return _save(fig, path)


def plot_loo(lines: Sequence[LooLine], path: str | Path, *, axis: str = "gpu_hours",
             title: str | None = None) -> Path:
    """Leave-one-out lines: log F(R) against log compute with A shared; slopes are B.

    Points from :func:`scalectl.science.compare.loo_lines`; each run's line is
    log F = B log C, the fitted curve in this transform.
    """
    if not lines:
        raise ValueError("plot_loo needs at least one line")
    fig = _new_figure()
    ax = fig.add_subplot()
    for i, ln in enumerate(lines):
        color = _COLORS[i % len(_COLORS)]
        ax.scatter(ln.log_c, ln.log_f, s=14, color=color, alpha=0.8)
        if ln.log_c.size:
            xs = np.linspace(ln.log_c.min(), ln.log_c.max(), 2)
            ax.plot(xs, ln.B * xs, color=color, lw=2, label=f"{ln.name}: B {ln.B:.2f}, "
                                                            f"C_mid {ln.C_mid:.3g}")
    ax.set_xlabel(f"log {AXIS_LABELS.get(axis, axis)}")
    ax.set_ylabel("log F(R) = log[C_mid^B / ((A - R0)/(R - R0) - 1)]")
    ax.set_title(title or f"Linearised curves with shared A = {lines[0].A:.3f} (slope = B)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def plot_truncation(series: dict[str, list[tuple[np.ndarray, np.ndarray]]], path: str | Path, *,
                    axis: str = "gpu_hours", threshold: float = TRUNCATION_THRESHOLD) -> Path:
    """Truncation rate (share of completions cut at the length limit) against
    compute, one colour per variant (one line per seed), with the flag
    threshold (docs/method.md, section 5: runs past 10-15% became unstable)."""
    fig = _new_figure((7.5, 4.0))
    ax = fig.add_subplot()
    for i, (name, runs) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        for j, (x, t) in enumerate(runs):
            ok = np.isfinite(t) & (x > 0)
            ax.plot(x[ok], t[ok], "o-", ms=3, lw=1.2, color=color, alpha=0.85,
                    label=name if j == 0 else None)
    ax.axhline(threshold, color="black", ls=":", lw=1, label=f"flag threshold {threshold:g}")
    _log_x(ax)
    ax.set_xlabel(AXIS_LABELS.get(axis, axis))
    ax.set_ylabel("truncation rate")
    ax.set_ylim(bottom=0)
    ax.set_title("Truncation rate against compute")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)
