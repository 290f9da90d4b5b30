"""Bootstrap refits of a sigmoid fit (the draws behind intervals and bands)."""

from __future__ import annotations

import math

import numpy as np

from scalectl.curve.model import _R0, FitError, _model
from scalectl.curve.solvers import _lm


def _bootstrap(theta, free, logc, y, resid, n0, lo, hi, n_boot, seed, kind):
    """Residual (default) or pairs bootstrap; refits warm-started at ``theta``.

    residual: y* = fit + residuals drawn with replacement (scaled by sqrt(n/(n-p)),
    centred); R0*, when measured from n0 points at compute 0, is R0 plus the mean
    of n0 drawn residuals.  pairs: the points are drawn with replacement (as
    weights).  Returns theta draws (n_boot, 4).
    """
    rng = np.random.default_rng(seed)
    n, p = y.size, int(free.sum())
    res = (resid - resid.mean()) * math.sqrt(n / max(n - p, 1))
    start = np.tile(theta, (n_boot, 1))
    if n0:
        start[:, _R0] = theta[_R0] + res[rng.integers(0, n, (n_boot, n0))].mean(axis=1)
    fit = _model(theta, logc)
    if kind == "residual":
        ys, w = fit + res[rng.integers(0, n, (n_boot, n))], None
    elif kind == "pairs":
        ys, w = y, rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(float)
    else:
        raise FitError(f"bootstrap kind {kind!r} is not one of: residual, pairs")
    draws, _ = _lm(start, free, logc, ys, lo, hi, w=w, iters=30)
    return draws
