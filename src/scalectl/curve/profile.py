"""The profile likelihood of the ceiling A: what the points say about A, whatever the optimiser returned.

For each A on a grid over its bounds, the other parameters (C_mid, B and R0 when
fitted) are fitted again with A held there, by a global coarse search and
warm-started Levenberg-Marquardt steps (:func:`scalectl.curve.solvers._lm`), and
the residual sum of squares of that refit is the profile RSS_p(A).  The values
of A whose refit is within the noise of the best fit,

    RSS_p(A) - RSS_min <= sigma^2 F(1, dof; level),

form the profile-likelihood interval of A (Bates and Watts 1988, "Nonlinear
Regression Analysis and Its Applications", section 6.1: the F test of one
parameter in nonlinear least squares; sigma^2 = RSS_min / dof, times the lag-1
variance inflation of :func:`scalectl.curve.fit.ar1_inflation` for dependent
points).  When that set reaches a bound of A (the data fit as well with A = 1),
A is not identified by the data (practical non-identifiability: Raue et al. 2009,
"Structural and practical identifiability analysis of partially observed
dynamical models by exploiting the profile likelihood", Bioinformatics 25(15),
section 2.3).

Unlike a bootstrap, whose refits start from the fit and stay in its basin of the
least squares, the profile searches C_mid and B afresh for every A: a spurious
bend in noisy points cut before the midpoint gives a narrow bootstrap interval
but a profile that stays flat up to A = 1.

Points: window points beyond :data:`MAX_PROFILE_POINTS` are thinned to every
k-th in compute order with their weights multiplied by k (the thinned sums
estimate the full ones), so the profile's memory and time stay bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import f as f_dist

from scalectl.curve.model import _A, _B, _R0, _U
from scalectl.curve.solvers import _lm

#: Step of the A grid of the profile (pass rate); the interval's ends are interpolated between steps.
PROFILE_STEP = 0.02
#: Window points beyond this are thinned for the profile (every k-th, weight k).
MAX_PROFILE_POINTS = 2000
#: Elements (problems x points) of one block of the batched refits.
_BLOCK = 2_000_000


@dataclass(frozen=True)
class CeilingProfile:
    """The profile of A.

    values (k,): the A grid (pass rate); ssr (k,): the weighted residual sum of
    squares of each refit with A held there; ssr_min: the smallest (of the fit's and
    the profile's); cutoff: sigma^2 F(1, dof; level), the rise of RSS that the noise
    allows; interval: (lo, hi) of A within the cutoff (interpolated between grid
    values on the signed root of the rise, which is close to linear in A);
    open_low / open_high: the set reaches the lower / upper bound of A (A is not
    identified on that side); level: of the interval; c_mid_high: the latest midpoint C_mid
    (compute units) among the refits within the cutoff (A and C_mid trade off: the curves with
    the highest A the points allow bend latest); refits (k, 4): the refit of each grid value
    (A, log C_mid, B, R0).
    """

    values: np.ndarray
    ssr: np.ndarray
    ssr_min: float
    cutoff: float
    interval: tuple[float, float]
    open_low: bool
    open_high: bool
    level: float
    c_mid_high: float
    refits: np.ndarray

    @property
    def identified(self) -> bool:
        """Whether the interval of A is closed on both sides within the bounds."""
        return not (self.open_low or self.open_high)


def _thin(logc: np.ndarray, y: np.ndarray, w: np.ndarray, n0: int):
    """(logc, y, w) with the window beyond MAX_PROFILE_POINTS thinned to every k-th point,
    weight multiplied by k; the n0 observations of R0 kept."""
    m = logc.size - n0
    if m <= MAX_PROFILE_POINTS:
        return logc, y, w
    k = math.ceil(m / MAX_PROFILE_POINTS)
    idx = np.concatenate([np.arange(n0), n0 + np.arange(0, m, k)])
    wt = w[idx].copy()
    wt[n0:] *= m / (idx.size - n0)
    return logc[idx], y[idx], wt


def _coarse_starts(logc, y, w, a_values, r0, lo, hi) -> np.ndarray:
    """For each A (k,), the best (log C_mid, B) of a coarse grid with R0 solved linearly
    (or given): starts (k, 4).  The grid's sums over points are accumulated in chunks, so
    memory does not grow with the points times the grid."""
    u_grid = np.linspace(lo[_U], hi[_U], 48)
    b_grid = np.geomspace(max(lo[_B], 0.3), min(hi[_B], 10.0), 24)
    uu, bb = (g.ravel() for g in np.meshgrid(u_grid, b_grid, indexing="ij"))
    sums = np.zeros((5, uu.size))
    chunk = max(1, _BLOCK // uu.size)
    for i in range(0, logc.size, chunk):
        lc, yc, wc = logc[i:i + chunk], y[i:i + chunk], w[i:i + chunk]
        s = expit(bb[:, None] * (lc[None, :] - uu[:, None]))
        p = 1.0 - s
        ws, wp = s * wc, p * wc
        sums += np.stack([(ws * s).sum(1), (ws * p).sum(1), (wp * p).sum(1), ws @ yc, wp @ yc])
    ss, sp, pp, sy, py = sums
    yy = float(np.sum(w * y * y))
    a = a_values[:, None]
    if r0 is None:
        r = np.clip((py - a * sp) / np.maximum(pp, 1e-300), lo[_R0], hi[_R0])
    else:
        r = np.full((a_values.size, uu.size), r0)
    ssr = yy - 2 * a * sy - 2 * r * py + a * a * ss + 2 * a * r * sp + r * r * pp
    j = np.argmin(ssr, axis=1)
    rows = np.arange(a_values.size)
    return np.stack([a_values, uu[j], bb[j], r[rows, j]], axis=1)


def _refit(starts: np.ndarray, free: np.ndarray, logc, y, w, lo, hi, iters: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Batched LM refits of ``starts`` (m, 4), in blocks of bounded size: (theta (m, 4), ssr (m,))."""
    block = max(1, _BLOCK // max(logc.size, 1))
    ones = bool(np.all(w == 1.0))
    thetas, ssrs = [], []
    for i in range(0, len(starts), block):
        part = starts[i:i + block]
        t, q = _lm(part, free, logc, y, lo, hi, w=None if ones else np.broadcast_to(w, (len(part), w.size)),
                   iters=iters)
        thetas.append(t)
        ssrs.append(q)
    return np.concatenate(thetas), np.concatenate(ssrs)


def profile_ceiling(theta: np.ndarray, logc: np.ndarray, y: np.ndarray, w: np.ndarray, n0: int,
                    r0: float | None, lo: np.ndarray, hi: np.ndarray, sigma2: float, dof: int,
                    level: float = 0.95, step: float = PROFILE_STEP) -> CeilingProfile:
    """The profile of A around a fit (module docstring).

    theta (4,): the fit (A, log C_mid, B, R0); logc, y, w (n0 + m,): log compute, pass rate
    and weights of the fit's observations (the n0 observations of R0 first); r0: a given R0
    (held), None when R0 is fitted; lo, hi (4,): the fit's bounds; sigma2: the noise
    variance of one point (pass rate^2, inflated for dependence); dof: the fit's degrees of
    freedom; level in (0, 1).  Returns a :class:`CeilingProfile`.
    """
    logc, y, w = _thin(logc, y, w, n0)
    a_values = np.unique(np.concatenate([np.arange(lo[_A], hi[_A], step), [hi[_A], theta[_A]]]))
    a_values = a_values[(a_values >= lo[_A]) & (a_values <= hi[_A])]
    free = np.array([False, True, True, r0 is None])
    th, q = _refit(_coarse_starts(logc, y, w, a_values, r0, lo, hi), free, logc, y, w, lo, hi)
    k = a_values.size
    r = y - (theta[_R0] + (theta[_A] - theta[_R0]) * expit(theta[_B] * (logc - theta[_U])))
    ssr_min = float(min(np.sum(w * r * r), q.min()))
    cutoff = float(sigma2 * f_dist.ppf(level, 1, max(dof, 1)))
    rise = np.maximum(q - ssr_min, 0.0)
    inside = np.flatnonzero(rise <= cutoff)
    i_lo, i_hi = int(inside.min()), int(inside.max())
    root, c = np.sqrt(rise), math.sqrt(cutoff)

    def cross(i: int, j: int, v: np.ndarray) -> float:
        """``v`` where the signed root reaches sqrt(cutoff) between grid values i (inside) and j."""
        t = (c - root[i]) / max(root[j] - root[i], 1e-300)
        return float(v[i] + min(max(t, 0.0), 1.0) * (v[j] - v[i]))

    low = float(a_values[0]) if i_lo == 0 else cross(i_lo, i_lo - 1, a_values)
    high = float(a_values[-1]) if i_hi == k - 1 else cross(i_hi, i_hi + 1, a_values)
    u = th[:, _U]
    ends = [u[i_lo] if i_lo == 0 else cross(i_lo, i_lo - 1, u), u[i_hi] if i_hi == k - 1 else cross(i_hi, i_hi + 1, u)]
    u_high = float(max(np.max(u[inside]), *ends, theta[_U]))
    return CeilingProfile(a_values, q, ssr_min, cutoff, (min(low, theta[_A]), max(high, theta[_A])),
                          i_lo == 0, i_hi == k - 1, level, math.exp(u_high), th)
