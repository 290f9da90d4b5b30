"""One style for every figure scalectl draws (fit, compare, extrapolate, report, ablation).

* The canvas: Matplotlib's object API on Agg (no pyplot, no global state), constrained
  layout, 7.5 x 5 inches at 100 dpi; written as ``.png`` or ``.svg`` (text kept as text).
* Colours: one per run, from the colour-blind-safe palette of Okabe and Ito (2008,
  "Color Universal Design"), in the order the runs are given.
* Compute axes: logarithmic, in the run's own units (GPU-hours, FLOPs, tokens, steps),
  ticks at 1, 2 and 5 x 10^k over less than :data:`DECADES_FOR_POWERS` decades and at
  the powers of ten beyond, labelled as plain numbers (0.02, 1,500) or as 2e12; never
  natural-log units.  Points at compute 0 (the step-0 evaluation, which gives R0)
  cannot sit on a log axis: they are drawn at the axis' left edge as hollow diamonds.
* Pass-rate axes: limits from the data and the ceilings that are identified, never
  from an interval that runs to the bound 1.0; an interval that leaves the axes is
  drawn to its edge with an arrow and its end written beside it.
* Legends: below the axes, inside the figure: as many columns as fit its width, and
  labels wrapped when one column is still too wide (:func:`legend_below`).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scalectl.display import AXIS_UNITS

#: Figure size (inches) and resolution of every figure: 750 x 500 pixels.
FIGSIZE = (7.5, 5.0)
DPI = 100
FORMATS = (".png", ".svg")
#: Okabe-Ito: blue, vermillion, bluish green, reddish purple, orange, sky blue, yellow, black.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#B8A200", "#000000")
#: Compute spans of at least this many decades are ticked at powers of ten only.
DECADES_FOR_POWERS = 2.5
#: What each compute axis measures, with its unit.
AXIS_LABELS = {
    "gpu_hours": "training compute (GPU-hours)",
    "flops": "training compute (FLOPs)",
    "tokens": "tokens trained",
    "step": "optimiser steps",
}
#: The unit of each compute axis, for titles and sentences.
PASS_RATE_LABEL = "pass rate (mean@k)"
#: Characters of a title line before it is wrapped.
TITLE_WIDTH = 88
_RC = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
       "xtick.labelsize": 8, "ytick.labelsize": 8, "svg.fonttype": "none"}


def color(i: int) -> str:
    """The colour of the ``i``-th run (0-based), cycling through :data:`PALETTE`."""
    return PALETTE[i % len(PALETTE)]


def new_figure(size: tuple[float, float] = FIGSIZE) -> Figure:
    """An empty figure on an Agg canvas with constrained layout and the common font sizes."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def new_axes(fig: Figure):
    """The figure's one axes, with the common grid."""
    with matplotlib.rc_context(_RC):
        ax = fig.add_subplot()
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.12)
    return ax


def axes_with_strip(fig: Figure, n: int):
    """The main axes and, right of it sharing its y axis, a narrow strip with one slot per
    run (x = 0 .. n-1) for the intervals of the ceilings (:func:`interval_bar`)."""
    with matplotlib.rc_context(_RC):
        ax, strip = fig.subplots(1, 2, sharey=True, width_ratios=[9, 1 + 0.15 * max(0, n - 3)])
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.12)
    strip.grid(True, axis="y", alpha=0.3)
    strip.set_xlim(-0.7, n - 0.3)
    strip.set_xticks([])
    strip.tick_params(axis="y", left=False, labelleft=False)
    return ax, strip


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (.png or .svg, by the extension) and return the path.

    Raises:
        ValueError: an extension other than .png or .svg.
    """
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"plot file {str(path)!r}: extension {path.suffix or '(none)'!r} is not "
                         f"one of {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(_RC):
        fig.savefig(path, dpi=fig.dpi)
    return path


def axis_label(axis: str) -> str:
    """The label of a compute axis, with its unit (:data:`AXIS_LABELS`)."""
    return AXIS_LABELS.get(axis, axis)


def compute_text(value: float, axis: str) -> str:
    """A compute value with its unit: ``0.25 GPU-hours``, ``2.3e12 FLOPs``."""
    from scalectl.display import format_number

    return f"{format_number(value, 2)} {AXIS_UNITS.get(axis, axis)}"


def set_title(ax, text: str, **kw) -> None:
    """The axes' title, each line wrapped at :data:`TITLE_WIDTH` characters."""
    lines = [w for line in text.split("\n") for w in (textwrap.wrap(line, TITLE_WIDTH) or [""])]
    ax.set_title("\n".join(lines), fontsize=_RC["axes.titlesize"], **kw)


def set_ylabel(ax, text: str) -> None:
    """The y label at the common size."""
    ax.set_ylabel(text, fontsize=_RC["axes.labelsize"])


def tick_text(value: float) -> str:
    """A compute tick as people write it: ``0.02``, ``1,500``, ``20,000``; ``2e12`` at or above
    1e5 and ``5e-4`` below 1e-3."""
    if value <= 0 or not math.isfinite(value):
        return ""
    e = math.floor(math.log10(value) + 1e-9)
    mant = value / 10 ** e
    if 1e-3 <= value < 1e5:
        digits = max(0, -e + (0 if abs(mant - round(mant)) < 1e-6 else 1))
        return f"{value:,.{digits}f}"
    m = f"{mant:.1f}".rstrip("0").rstrip(".")
    return f"{m}e{e}"


def log_ticks(axis_obj, lo: float, hi: float) -> None:
    """Ticks of a log axis (``ax.xaxis`` or ``ax.yaxis``) over [lo, hi]: 1, 2, 5 x 10^k over less
    than :data:`DECADES_FOR_POWERS` decades, else the powers of ten (unlabelled minor ticks
    between), written by :func:`tick_text`."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if math.log10(hi / lo) >= DECADES_FOR_POWERS:
        axis_obj.set_major_locator(LogLocator(base=10, subs=(1.0,)))
        axis_obj.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    else:
        axis_obj.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis_obj.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    axis_obj.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v)))
    axis_obj.set_minor_formatter(NullFormatter())


def compute_axis(ax, axis: str, lo: float, hi: float, *, zero_edge: bool = False) -> None:
    """Make the x axis a log compute axis over [lo, hi] (positive) in ``axis``'s units
    (:func:`log_ticks`, :func:`axis_label`).  With ``zero_edge`` the left limit leaves room
    for the points at compute 0 drawn there (:func:`draw_compute_zero`)."""
    lo, hi = float(lo), float(hi)
    if not (lo > 0 and hi > lo):
        hi = lo * 10 if lo > 0 else 1.0
        lo = hi / 10
    ax.set_xscale("log")
    pad = (hi / lo) ** 0.04
    ax.set_xlim(lo / (pad * (1.6 if zero_edge else 1.0)), hi * pad)
    log_ticks(ax.xaxis, lo, hi)
    ax.set_xlabel(axis_label(axis), fontsize=_RC["axes.labelsize"])


def positive_range(xs: Iterable[np.ndarray]) -> tuple[float, float]:
    """Smallest and largest positive value over the arrays.

    Raises:
        ValueError: no positive value.
    """
    pos = np.concatenate([np.asarray(x, dtype=float).ravel() for x in xs])
    pos = pos[np.isfinite(pos) & (pos > 0)]
    if not pos.size:
        raise ValueError("no point with compute > 0 to draw on a log compute axis")
    return float(pos.min()), float(pos.max())


def pass_rate_limits(values: Iterable[float], *, floor: float = 0.0, ceiling: float = 1.0,
                     min_span: float = 0.1) -> tuple[float, float]:
    """y limits that hold ``values`` (the points, the curves, the identified ceilings, the
    margin band) with 6 % of their span spare on each side, at least ``min_span`` tall,
    within [floor, ceiling] widened by 0.01 so that a value at a bound stays visible."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if not v.size:
        return floor, ceiling
    lo, hi = float(v.min()), float(v.max())
    if hi - lo < min_span:
        mid = (hi + lo) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    pad = 0.06 * (hi - lo)
    return max(floor - 0.01, lo - pad), min(ceiling + 0.01, hi + pad)


def pass_rate_axis(ax, limits: tuple[float, float], label: str = PASS_RATE_LABEL) -> None:
    """Set the y limits and label of a pass-rate axis."""
    ax.set_ylim(*limits)
    set_ylabel(ax, label)


def draw_compute_zero(ax, y: Sequence[float], color_: str, *, label: str | None = None) -> None:
    """The points at compute 0 (step 0), drawn at the left edge of a log compute axis as
    hollow diamonds (they cannot sit on the axis itself)."""
    y = np.asarray(y, dtype=float)
    if not y.size:
        return
    x0 = ax.get_xlim()[0]
    ax.scatter(np.full(y.size, x0), y, marker="D", s=26, facecolors="white", edgecolors=color_,
               linewidths=1.2, zorder=4, clip_on=False, label=label)


def interval_bar(ax, x: float, value: float, interval: tuple[float, float], color_: str) -> None:
    """A vertical bar of ``interval`` with a tick at ``value``, at ``x``; a side that leaves the
    y limits is drawn to the edge and ends in an arrow, and an estimate off the axes is
    written beside that edge (the legend gives the interval)."""
    y0, y1 = ax.get_ylim()
    lo, hi = interval
    if lo <= y1 and hi >= y0:
        ax.plot([x, x], [max(lo, y0), min(hi, y1)], color=color_, lw=2.4, alpha=0.75, solid_capstyle="butt",
                zorder=5)
    if y0 <= value <= y1:
        ax.plot([x], [value], marker="_", ms=12, mew=2.4, color=color_, zorder=6)
    if hi > y1:
        ax.plot([x], [y1], marker="^", ms=6, color=color_, clip_on=False, zorder=6)
    if lo < y0:
        ax.plot([x], [y0], marker="v", ms=6, color=color_, clip_on=False, zorder=6)
    if not y0 <= value <= y1:           # the estimate itself is off the axes: write it there
        above = value > y1
        ax.annotate(f"A {value:.2f}", (x, y1 if above else y0), xytext=(0, -8 if above else 8),
                    textcoords="offset points", rotation=90, ha="center", va="top" if above else "bottom",
                    fontsize=7, color=color_)


def legend_below(fig: Figure, ax, handles=None, labels=None, *, max_cols: int = 2):
    """The legend below the axes, inside the figure: ``max_cols`` columns if they fit the
    figure's width, else fewer, and when one column is still too wide its labels are
    wrapped to fit.  Returns the legend (None without entries)."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    labels = list(labels)
    ncol = max(1, min(max_cols, len(labels) if len(labels) > 3 else 1))
    width = fig.get_figwidth() * fig.dpi
    legend = None
    wrap = None
    for _ in range(6):
        if legend is not None:
            legend.remove()
        shown = labels if wrap is None else ["\n".join(textwrap.wrap(t, wrap)) or t for t in labels]
        with matplotlib.rc_context(_RC):
            legend = fig.legend(handles, shown, loc="outside lower center", ncol=ncol, frameon=False)
        fig.canvas.draw()
        extent = legend.get_window_extent(fig.canvas.get_renderer())
        if extent.x0 >= 0 and extent.x1 <= width:
            break
        if ncol > 1:
            ncol -= 1
            continue
        longest = max(len(t) for t in labels)
        wrap = max(20, int((wrap or longest) * 0.97 * width / extent.width) - 2)
    return legend


def text_outside(fig: Figure) -> list[str]:
    """The texts of ``fig`` (titles, labels, tick labels, legend entries, annotations) whose
    drawn extent leaves the canvas; empty when every one is inside.  Draws the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    w, h = fig.get_figwidth() * fig.dpi, fig.get_figheight() * fig.dpi
    tick_labels, drawn = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels.update({id(tick.label1), id(tick.label2)})
                loc = tick.get_loc()
                if loc is not None and lo <= loc <= hi:       # only ticks inside the view are drawn
                    drawn.update({id(tick.label1), id(tick.label2)})
    out = []
    for t in fig.findobj(matplotlib.text.Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        if id(t) in tick_labels and id(t) not in drawn:
            continue
        e = t.get_window_extent(renderer)
        if e.width == 0 and e.height == 0:
            continue
        if e.x0 < -0.5 or e.y0 < -0.5 or e.x1 > w + 0.5 or e.y1 > h + 0.5:
            out.append(t.get_text())
    return out
