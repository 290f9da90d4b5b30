"""Bounds of the numeric command-line options, checked when the command line is read.

Each numeric option carries a callback from here: a value out of its range, or not a finite
number (``nan``, ``inf``), is refused by click as a usage error, ``Invalid value for
'--margin': ...`` naming what is allowed, with exit status 2 and no traceback, before the
command opens the store or reads a file.  The limits:

* fractions (``--fraction``): in (0, 1]; levels (``--level``): in (0, 1);
* a margin on A (``--margin``): in (0, 1), a difference of pass rates (or ``auto`` where the
  command can measure it, :mod:`scalectl.science.margin`);
* bootstrap resamples: 0..:data:`scalectl.defaults.MAX_BOOTSTRAP` (derived there
  from the memory a resample keeps);
* seeds: 0..2^32 - 1 (numpy's and the recipe's); steps: 1..10^9 (the recipe's
  ``budget.steps``); seeds per variant: 1..:data:`MAX_SEEDS`;
* compute, GPU-hours, rates and seconds: finite, with the sign they need.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer

#: Largest seed (numpy's generators and the recipe's ``seed`` take 32 bits).
MAX_SEED = 2**32 - 1
#: Most optimiser steps of a run (the recipe's ``budget.steps`` bound).
MAX_STEPS = 10**9
#: Most seeds per variant of an ablation (each seed is one run of every variant).
MAX_SEEDS = 1000
#: Longest wait between two looks at running jobs, in seconds (an hour).
MAX_POLL_S = 3600.0


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def allowed(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """The range in words: '> 0 and < 1', '>= 0', '0..100,000'."""
    if lo is not None and hi is not None and not lo_open and not hi_open and isinstance(lo, int):
        return f"{_num(lo)}..{_num(hi)}"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {_num(lo)}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {_num(hi)}")
    return " and ".join(parts) or "any finite number"


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False, note: str = "") -> Callable[[Any], Any]:
    """A typer callback refusing a number (or each of a list) outside [lo, hi] (``lo_open``,
    ``hi_open``: the end itself excluded) or not finite; None (an option not given) passes.

    Raises (when called):
        typer.BadParameter: naming the value and the range (click: exit status 2).
    """
    text = allowed(lo, hi, lo_open, hi_open) + (f" ({note})" if note else "")

    def check(value):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is None:
                continue
            if isinstance(v, float) and not math.isfinite(v):
                raise typer.BadParameter(f"{v} is not a finite number; allowed: {text}")
            if (lo is not None and (v < lo or (lo_open and v == lo))) or \
                    (hi is not None and (v > hi or (hi_open and v == hi))):
                raise typer.BadParameter(f"{v if isinstance(v, int) else format(v, 'g')} is out of range; allowed: {text}")
        return value

    return check


def margin_choice(value: str | None):
    """A typer callback for ``--margin auto|NUMBER``: the number checked like
    :func:`scalectl.science.margin.check_value`; returns None, ``"auto"`` or a float."""
    from scalectl.errors import UserError
    from scalectl.science.margin import parse_choice

    try:
        return parse_choice(value)
    except UserError:
        raise typer.BadParameter(f"{value} is neither a number > 0 and < 1 (a difference of pass rates; the "
                                 "paper's is 0.02) nor auto (measured from the seeds in the store)") from None


def r0_choice(value: str):
    """A typer callback for ``--r0 auto|measured|fit|NUMBER``: a number must be finite and in [0, 1];
    None (not given) stays None."""
    if value is None or value in ("auto", "measured", "fit"):
        return value
    try:
        v = float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not one of: auto, measured, fit, or a number in [0, 1]") from None
    number(0.0, 1.0, note="a pass rate")(v)
    return value
