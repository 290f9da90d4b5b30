"""Bootstrap refits of a sigmoid fit: the draws behind intervals and prediction bands.

Three ways to make a resample, all refitted at once by warm-started
Levenberg-Marquardt steps (:func:`scalectl.curve.solvers._lm`):

* ``"block"`` (default): a moving-block bootstrap of the residuals (Kunsch 1989,
  "The jackknife and the bootstrap for general stationary observations", Ann.
  Statist. 17(3); Politis and Romano 1994 for the stationary variant).  Real
  evaluation points are not independent around one curve: the policy drifts
  and neighbouring points dip and recover together.  Drawing the residuals in
  runs of consecutive points keeps that dependence in every resample, so the
  refits, hence intervals and bands, carry it.
* ``"residual"``: residuals drawn one by one (independent noise).
* ``"pairs"``: the points themselves drawn with replacement (as weights).

Points at compute 0 (observations of R0) come first in the arrays.  Their
noise is drawn from N(0, r0_se^2) when the standard error of that evaluation
is known, else from the window's residuals like any other point.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from scalectl.curve.model import FitError, _model
from scalectl.curve.solvers import _lm, block_rows
from scalectl.defaults import MAX_BOOTSTRAP

BootstrapKind = Literal["block", "residual", "pairs"]
KINDS = ("block", "residual", "pairs")


def default_block_length(n: int) -> int:
    """Block length of the moving-block bootstrap for n window points: n^(1/3) rounded,
    at least 2 (Hall, Horowitz and Jing 1995: the variance-optimal length grows as
    n^(1/3))."""
    return max(2, round(n ** (1 / 3))) if n >= 4 else 1


def block_indices(n: int, length: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) indices into n consecutive residuals, made of runs of ``length``
    consecutive indices starting anywhere in 0..n-length (moving blocks), cut to n."""
    length = max(1, min(int(length), n))
    k = -(-n // length)
    starts = rng.integers(0, n - length + 1, (n_boot, k))
    idx = (starts[..., None] + np.arange(length)).reshape(n_boot, k * length)
    return idx[:, :n]


def bootstrap_draws(theta: np.ndarray, free: np.ndarray, logc: np.ndarray, y: np.ndarray,
                    resid: np.ndarray, n0: int, lo: np.ndarray, hi: np.ndarray, n_boot: int,
                    seed: int, kind: str = "block", *, weights: np.ndarray | None = None,
                    r0_se: float | None = None, block: int | None = None,
                    inflate: float = 1.0) -> np.ndarray:
    """Parameter draws (n_boot, 4; A, log C_mid, B, R0) of bootstrap refits.

    theta (4,) the fit; free (4,) the fitted parameters; logc, y, resid, weights
    (n,) with the n0 observations at compute 0 first and the window points after
    them in order of compute.  Residuals of the window are centred and scaled by
    sqrt(n/(n-p)) (p fitted parameters) and by ``inflate`` (the variance inflation
    of dependent noise, :func:`scalectl.curve.fit.ar1_inflation`).  ``block``: block
    length for ``"block"`` (default :func:`default_block_length`).  The refits run in blocks of
    resamples whose arrays hold at most :data:`scalectl.curve.solvers.GRID_BLOCK_ELEMENTS`
    elements each (one block, the same draws as ever, while n_boot x n is below it), so the
    memory grows linearly in the points.  Raises FitError on an unknown kind or n_boot
    outside 1..:data:`MAX_BOOTSTRAP`.
    """
    if kind not in KINDS:
        raise FitError(f"bootstrap kind {kind!r} is not one of: {', '.join(KINDS)}")
    if not 0 < n_boot <= MAX_BOOTSTRAP:
        raise FitError(f"bootstrap resamples must lie in 1..{MAX_BOOTSTRAP:,} (given {n_boot})")
    rng = np.random.default_rng(seed)
    n = y.size
    nw = n - n0
    p = int(free.sum())
    rw = resid[n0:]
    res = (rw - rw.mean()) * math.sqrt(nw / max(nw - p, 1)) * inflate
    rows = block_rows(n)
    parts = [_refits(theta, free, logc, y, res, n0, lo, hi, min(rows, n_boot - j), rng, kind,
                     weights, r0_se, block or default_block_length(nw))
             for j in range(0, n_boot, rows)]
    return np.concatenate(parts)


def _refits(theta, free, logc, y, res, n0, lo, hi, m: int, rng, kind: str, weights, r0_se, block: int):
    """One block of ``m`` bootstrap refits (:func:`bootstrap_draws`): (m, 4) parameter draws.
    Each array of the block holds m x n elements (n points)."""
    n = y.size
    nw = n - n0
    start = np.tile(theta, (m, 1))
    w = None if weights is None else np.broadcast_to(weights, (m, n))
    if kind == "pairs":
        draw = rng.multinomial(n, np.full(n, 1.0 / n), size=m).astype(float)
        w = draw if w is None else draw * w
        draws, _ = _lm(start, free, logc, y, lo, hi, w=w, iters=30)
        return draws
    if kind == "block":
        idx = block_indices(nw, block, m, rng)
    else:
        idx = rng.integers(0, nw, (m, nw))
    noise = np.empty((m, n))
    noise[:, n0:] = res[idx]
    if n0:
        noise[:, :n0] = (rng.normal(0.0, r0_se, (m, n0)) if r0_se is not None
                         else res[rng.integers(0, nw, (m, n0))])
    draws, _ = _lm(start, free, logc, _model(theta, logc) + noise, lo, hi, w=w, iters=30)
    return draws
