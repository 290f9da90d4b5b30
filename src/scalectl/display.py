"""How numbers are shown to people: estimates with their intervals, compute values,
and tables that fit the terminal.

Pure functions returning strings (and a rich ``Table`` built from strings); no
printing here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

#: Values at or above this magnitude (or nonzero below SCI_BELOW) print in scientific notation.
SCI_FROM = 1e5
SCI_BELOW = 1e-3
#: An interval whose longer side exceeds this multiple of its shorter side is lopsided:
#: each number is then rounded to its own significant digits (the log scale).
LOPSIDED = 3.0
#: An estimate keeps at least this many significant digits.
MIN_DIGITS = 2

#: The unit of each compute axis, as prose writes it.
AXIS_UNITS = {"gpu_hours": "GPU-hours", "flops": "FLOPs", "tokens": "tokens", "step": "steps"}


def _exp10(v: float) -> int:
    """Decimal exponent of ``v`` (0.1 -> -1 even when 0.1 came out as 0.0999...)."""
    return math.floor(math.log10(abs(v)) + 1e-9)


def _sci(v: float, step_exp: int) -> str:
    """``v`` in scientific notation rounded at 10**step_exp: 4.8e3, 1.40e13, -2.0e-4."""
    if v == 0:
        return "0"
    e = _exp10(round(v, -step_exp) or v)
    digits = max(0, e - step_exp)
    mant, _, ex = f"{v:.{digits}e}".partition("e")
    return f"{mant}e{int(ex)}"


def _fixed(v: float, step_exp: int) -> str:
    """``v`` in fixed notation rounded at 10**step_exp (no decimals when step_exp >= 0)."""
    if step_exp >= 0:
        return f"{round(v, -step_exp):.0f}"
    return f"{v:.{-step_exp}f}"


def _use_sci(values: Sequence[float]) -> bool:
    mags = [abs(v) for v in values if v != 0 and math.isfinite(v)]
    return bool(mags) and (max(mags) >= SCI_FROM or min(mags) < SCI_BELOW)


def format_number(value: float | None, digits: int = 3, *, decimals: bool = False) -> str:
    """One number without interval, scientific at or above :data:`SCI_FROM` and (nonzero) below
    :data:`SCI_BELOW`; zero as ``0``, None as ``-``.

    By default ``digits`` significant digits: 2542.3 -> ``2540``; 2.1e12 -> ``2.10e12``;
    0.6123 -> ``0.612``.  With ``decimals`` (the cells of the run tables: ``runs``, ``show``,
    ``status``, an ablation's runs), ``digits`` decimal places, Python's ``.{digits}g`` when
    scientific, and a value that is not a float (a step count) as it is: 0.6123 -> ``0.612``,
    12.5 -> ``12.500``, 2.1e12 -> ``2.1e+12``, 120 -> ``120``.
    """
    if value is None:
        return "-"
    if decimals and not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if decimals:
        return f"{value:.{digits}g}" if _use_sci([value]) else f"{value:.{digits}f}"
    step = _exp10(value) - digits + 1
    return _sci(value, step) if _use_sci([value]) else _fixed(value, step)


def format_estimate(value: float, interval: tuple[float, float] | None) -> str:
    """``value [lo, hi]`` with no digit finer than the interval supports, and never fewer
    than two significant digits of the estimate.

    * Symmetric-ish interval: every number is rounded at the leading digit of the
      shorter side of the interval (0.6123 [0.598, 0.627] -> ``0.61 [0.60, 0.63]``),
      or finer when the estimate would otherwise keep fewer than 2 significant digits.
    * Lopsided interval (positive bounds, one side more than 3x the other, as a
      C_mid interval is): rounded on the log scale, each number to 2 significant
      digits of its own (2563 [1912, 8950] -> ``2600 [1900, 9000]``).
    * Magnitudes >= 1e5 or < 1e-3 print in scientific notation
      (C_mid in FLOPs: ``2.1e12 [1.0e12, 1.4e13]``; 4816 [3778, 103143] ->
      ``4.8e3 [3.8e3, 1.0e5]``).

    Without interval: 3 significant digits and ``(no interval)``.
    """
    if interval is None:
        text = format_number(value) if _use_sci([value]) else f"{value:.3g}"
        return f"{text} (no interval)"
    lo, hi = float(interval[0]), float(interval[1])
    if not all(math.isfinite(v) for v in (value, lo, hi)) or not hi > lo:
        return f"{value:.4g} [{lo:.4g}, {hi:.4g}]"
    sci = _use_sci([value, lo, hi])
    fmt = _sci if sci else _fixed
    below, above = value - lo, hi - value
    near = min(below, above)
    far = max(below, above)
    lopsided = lo > 0 and near > 0 and far / near > LOPSIDED
    # The estimate's rounding step: the leading digit of the shorter side, but at
    # least MIN_DIGITS significant digits of the estimate.
    step = _exp10(near) if near > 0 else _exp10((hi - lo) / 2)
    if value != 0:
        step = min(step, _exp10(value) - MIN_DIGITS + 1)
    if lopsided:     # an estimate on (or next to) a bound has a near side of ~0: no digits from it
        return " ".join([fmt(value, _exp10(value) - MIN_DIGITS + 1) if value != 0 else fmt(0.0, step),
                         "[" + ", ".join(fmt(b, _exp10(b) - MIN_DIGITS + 1) for b in (lo, hi)) + "]"])
    bounds = [fmt(b, step) if b != 0 else fmt(0.0, step) for b in (lo, hi)]
    return f"{fmt(value, step)} [{bounds[0]}, {bounds[1]}]"


def format_compute(value: float) -> str:
    """A compute value for a table: ``1,695``, ``12,710``, or ``3.6e21`` outside 100..1e7."""
    if 100 <= abs(value) < 1e7:
        return f"{value:,.0f}"
    return format_number(value)


# ----------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    """A table column: ``keep`` columns are never dropped; the others are dropped
    lowest ``priority`` first when the table does not fit the width."""

    name: str
    justify: str = "right"
    keep: bool = False
    priority: int = 0


def _needs(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width in characters: its longest cell (or header) plus 3 (padding and border)."""
    return [max([len(c.name)] + [len(r[i]) for r in rows]) + 3 for i, c in enumerate(columns)]


def table_width(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> int:
    """Characters a table of every column takes with no cell wrapped (rich's default box)."""
    return sum(_needs(columns, rows)) + 1


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None
                ) -> list[int]:
    """Indices of the columns that fit ``width`` terminal characters, in their order
    (``width`` None: every column, as off a terminal).

    Each column takes its longest cell (or header) plus 3 characters (padding and
    border of rich's default box), the table 1 more.  Droppable columns go lowest
    priority first (then rightmost first) until the rest fits; ``keep`` columns
    always stay, even when they alone are wider (their cells then wrap).  Columns
    dropped before the last one dropped come back, highest priority first, where they
    fit beside the rest.
    """
    shown = list(range(len(columns)))
    if width is None:
        return shown
    need = _needs(columns, rows)
    order = sorted((i for i, c in enumerate(columns) if not c.keep),
                   key=lambda i: (columns[i].priority, -i))
    dropped = []
    for i in order:
        if sum(need[j] for j in shown) + 1 <= width:
            break
        shown.remove(i)
        dropped.append(i)
    for i in reversed(dropped[:-1]):       # narrower columns dropped before a wide one may fit again
        if sum(need[j] for j in shown) + need[i] + 1 <= width:
            shown.append(i)
    return sorted(shown)


def fitted_table(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]],
                 width: int | None):
    """A rich ``Table`` of the columns that fit ``width`` (:func:`fit_columns`; None: every
    column); no cell is ever cut: where the kept columns alone are wider than ``width``
    their cells wrap (at spaces, else folded) instead.  Dropped columns are named in the
    caption."""
    from rich.table import Table

    shown = fit_columns(columns, rows, width)
    dropped = [c.name for i, c in enumerate(columns) if i not in shown]
    table = Table(title=title, caption=("not shown (narrow terminal): " + ", ".join(dropped)
                                        if dropped else None))
    whole = _unwrapped(columns, rows, shown, width)
    for i in shown:
        c = columns[i]
        table.add_column(c.name, justify=c.justify, no_wrap=i in whole, overflow="fold")
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table


def _unwrapped(columns: Sequence[Column], rows: Sequence[Sequence[str]], shown: Sequence[int],
               width: int | None) -> set[int]:
    """The shown columns drawn without wrapping (rich's ``no_wrap``).

    Where the shown columns fit ``width``: the kept ones (they stay whole while the others
    wrap).  Where the kept columns alone are wider: those of single words (run names), if
    they fit beside the others wrapped at their spaces (an estimate ``0.61 [0.60, 0.63]`` on
    two lines); else none, since rich crops a ``no_wrap`` cell that does not fit.
    """
    need = _needs(columns, rows)
    kept = {i for i in shown if columns[i].keep}
    if width is None or sum(need[i] for i in shown) + 1 <= width:
        return kept
    words = {i for i in kept if not any(" " in r[i] for r in rows)}
    narrowest = sum(need[i] if i in words else
                    max(len(w) for cell in [columns[i].name, *(r[i] for r in rows)] for w in cell.split() or [""]) + 3
                    for i in shown) + 1
    return words if narrowest <= width else set()


@dataclass(frozen=True)
class TableData:
    """A table before it is drawn: its title, columns and rows of cells (strings).

    :func:`scalectl.present.console.print_table` draws it fitted to a terminal, whole off
    one, or as CSV."""

    title: str | None
    columns: Sequence[Column]
    rows: Sequence[Sequence[str]]

    def render(self, width: int | None):
        """The rich ``Table`` of the columns that fit ``width`` (None: every column)."""
        return fitted_table(self.title, self.columns, self.rows, width)

    @property
    def width(self) -> int:
        """Characters the table takes with every column whole (:func:`table_width`)."""
        return table_width(self.columns, self.rows)

    def csv(self) -> str:
        """The header and the rows as CSV (every column; the title left out)."""
        import csv
        import io

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow([c.name for c in self.columns])
        writer.writerows(self.rows)
        return buf.getvalue()


def bytes_text(n: float) -> str:
    """``8.0 GB`` from 1 GB up, ``4.47 MB`` below (decimal units)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.3g} MB"


def count_text(n: float) -> str:
    """``8 B`` (billions) from 1e9 up, ``1.12 M`` below."""
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def duration_text(seconds: float) -> str:
    """A wall-clock span for people: ``45 s``, ``25 min``, ``3.2 h``, ``288 h``, ``62.5 days``
    (hours below 1,000, so that a booking of 72-hour jobs reads in hours)."""
    if not math.isfinite(seconds):
        return "-"
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    hours = s / 3600
    if hours < 1000:
        return f"{hours:.2g} h" if hours < 10 else f"{hours:,.0f} h"
    return f"{hours / 24:.1f} days"
