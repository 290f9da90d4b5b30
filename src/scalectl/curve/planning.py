"""Planning helpers on fitted curves: the spread of repeated seeds, and what would
narrow the interval of the ceiling (extend the run, or add seeds)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from scalectl.curve.model import SigmoidFit
from scalectl.defaults import MARGIN


@dataclass(frozen=True)
class Spread:
    """Spread of one parameter over repeated runs (seeds) of the same recipe."""

    name: str
    n: int
    mean: float
    sd: float
    min: float
    max: float

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Student-t interval of the mean over seeds (needs n >= 2)."""
        from scipy.stats import t

        if self.n < 2:
            raise ValueError(f"a seed interval of {self.name} needs at least 2 runs, got {self.n}")
        h = t.ppf(0.5 + level / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        return self.mean - h, self.mean + h


def seed_spread(fits: Sequence[SigmoidFit]) -> dict[str, Spread]:
    """Mean, sample sd, min and max of A, B and C_mid over fits of repeated runs.

    The paper (section 3/A.4) saw ceilings of three seeds within +-0.015, the basis
    of its 0.02 margin.  Raises ValueError on an empty list.
    """
    if not fits:
        raise ValueError("seed_spread needs at least one fit")
    out = {}
    for name in ("A", "B", "C_mid"):
        v = np.array([getattr(f, name) for f in fits], dtype=float)
        out[name] = Spread(name, v.size, float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0,
                           float(v.min()), float(v.max()))
    return out


@dataclass(frozen=True)
class Advice:
    """What would narrow the interval of A: ``action`` is none, extend or seeds."""

    action: Literal["none", "extend", "seeds"]
    width: float
    margin: float
    message: str
    seeds_needed: int | None = None


def advise(fit: SigmoidFit, margin: float = MARGIN, n_seeds: int = 1) -> Advice:
    """Say whether the A interval is wider than ``margin`` and what would help more.

    Data that stop before ~2 x C_mid (or a ceiling/bound flag) leave A traded off
    against C_mid and B: extending the run helps, more seeds do not.  Otherwise the
    width is noise: averaging s seeds shrinks it about as 1/sqrt(s), so about
    n_seeds * (width / margin)^2 seeds are needed.  Raises ValueError when the fit
    has no interval for A.
    """
    iv = fit.interval("A")
    if iv is None:
        raise ValueError("this fit has no interval for A: fit with bootstrap > 0")
    width = iv[1] - iv[0]
    if width <= margin:
        return Advice("none", width, margin, f"A interval width {width:.3f} is within the "
                                             f"margin {margin:.3f}")
    reach = fit.window[1] / fit.C_mid
    if reach < 2.0 or fit.has_flag("ceiling_not_identified") or fit.has_flag("on_bound"):
        if reach < 3.0:
            why, target = f"the data stop at {reach:.2f} x C_mid", 3.0
        else:   # far enough past C_mid, but an estimate sits on its bound: twice as long
            on = sorted({f.param for f in fit.flags if f.code == "on_bound" and f.param})
            why = (f"{' and '.join(on) or 'a parameter'} lie{'s' if len(on) < 2 else ''} on a bound "
                   f"although the data reach {reach:.2f} x C_mid")
            target = 2.0 * reach
        return Advice("extend", width, margin,
                      f"A interval width {width:.3f} exceeds the margin {margin:.3f} and {why}: extend "
                      f"the run to about {target:.3g} x C_mid ({target * fit.C_mid:.4g}); more seeds "
                      "would not pin the ceiling")
    need = max(n_seeds + 1, math.ceil(n_seeds * (width / margin) ** 2))
    return Advice("seeds", width, margin,
                  f"A interval width {width:.3f} exceeds the margin {margin:.3f} although the data "
                  f"reach {reach:.2f} x C_mid: the width is noise; about {need} seeds (or more "
                  "evaluation prompts) would bring it within the margin", seeds_needed=need)
