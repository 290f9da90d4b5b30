"""How numbers are shown to people: estimates with their intervals."""

from __future__ import annotations

import math


def format_estimate(value: float, interval: tuple[float, float] | None) -> str:
    """``value [lo, hi]`` rounded to the leading digit of the interval's half-width.

    So a number never looks more certain than its interval: 0.6123 with
    [0.598, 0.627] prints as ``0.61 [0.60, 0.63]``.  Without interval: 3
    significant digits and ``(no interval)``.
    """
    if interval is None:
        return f"{value:.3g} (no interval)"
    lo, hi = interval
    half = (hi - lo) / 2
    if not half > 0:
        return f"{value:.4g} [{lo:.4g}, {hi:.4g}]"
    d = -math.floor(math.log10(half))
    if d > 0:
        return f"{value:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"
    r = lambda v: f"{round(v, d):.0f}"  # noqa: E731
    return f"{r(value)} [{r(lo)}, {r(hi)}]"
