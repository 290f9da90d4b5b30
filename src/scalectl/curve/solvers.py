"""Numerical solvers of the sigmoid fit: the paper's grid, variable projection,
and a projected Levenberg-Marquardt that refines many problems at once.

* ``"vp"``: a coarse search over (C_mid, B) in which (A, R0) are solved by
  linear least squares (the curve is linear in them: variable projection),
  polished by bounded ``scipy.optimize.least_squares`` in (A, log C_mid, B[, R0]).
* ``"grid"``: the paper's procedure (Khatri et al. 2025, appendix A.5): A on
  0.450..0.800 step 0.005, C_mid on 100 linearly spaced values in [100, 40 000],
  B by least squares for each pair, smallest sum of squared residuals wins.

Parameter vectors are (..., 4) in the order A, log C_mid, B, R0.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit

from scalectl.curve.model import (_A, _B, _R0, _U, PAPER_A_GRID, PAPER_C_MID_GRID, FitError,
                                  GridSpec, _jacobian, _model)


#: Largest number of float64 elements of one array of a grid search (8 MiB): the searches
#: below evaluate their grid in blocks of rows (grid points) x n points within it, so that
#: their memory grows linearly in the points, not in grid points x points.
GRID_BLOCK_ELEMENTS = 1 << 20


def block_rows(per_row: int, budget: int | None = None) -> int:
    """Rows of a block whose arrays hold at most ``budget`` elements (default
    :data:`GRID_BLOCK_ELEMENTS`) when each row holds ``per_row`` (at least 1 row, so a row
    larger than the budget is one block)."""
    budget = GRID_BLOCK_ELEMENTS if budget is None else budget
    return max(1, budget // max(int(per_row), 1))


#: Most points of one stretch of a run that a fit of stored points solves on: beyond it,
#: :func:`bin_points` averages consecutive points (scalectl.science.fits).
MAX_FIT_POINTS = 2_000


def bin_points(x: np.ndarray, y: np.ndarray, truncation: np.ndarray | None = None,
               max_points: int = MAX_FIT_POINTS) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """At most ``max_points`` bins of consecutive points, for a run with more points than a
    fit needs (an imported per-step log of 300,000 evaluations).

    The rule: the points, in order of compute (x (n,) > 0, sorted ascending), are cut into
    ``max_points`` runs of consecutive points whose sizes differ by at most one (n //
    max_points or one more); each bin is one point at the geometric mean of its compute
    (the curve is fitted in log compute) with the mean of its pass rates y (n,), and the
    largest of its truncation rates (n,) (the flag looks at the largest; NaN where none).
    Equal counts give every bin the same noise variance, sigma^2 / count, so the least
    squares and the residual bootstrap on the bins need no weights; the information about
    the curve is that of the points while the curve is near-linear within a bin.  n <=
    ``max_points``: the points unchanged.

    Returns (x (m,), y (m,), truncation (m,) or None, counts (m,)).  Raises ValueError on
    a compute <= 0 or max_points < 1.
    """
    n = x.size
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1 (given {max_points})")
    if n <= max_points:
        return x, y, truncation, np.ones(n, dtype=int)
    if np.any(x <= 0):
        raise ValueError("bin_points needs compute > 0 (points at compute 0 observe R0 and stay as they are)")
    edges = np.linspace(0, n, max_points + 1).round().astype(int)
    counts = np.diff(edges)
    starts = edges[:-1]
    xb = np.exp(np.add.reduceat(np.log(x), starts) / counts)
    yb = np.add.reduceat(y, starts) / counts
    tb = None if truncation is None else np.fmax.reduceat(truncation, starts)
    return xb, yb, tb, counts


def resolve_grid(spec: GridSpec | None, x: np.ndarray, y: np.ndarray, axis: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A values and C_mid values of the grid method.

    Defaults: A on the paper's 0.450..0.800 step 0.005, widened in 0.005 steps to
    reach from the highest window pass rate minus 0.1 (floored at 0) to it plus
    0.1 (capped at 1) when the data leave the paper's range.  C_mid: the paper's
    100 linear values in [100, 40 000] when the axis is GPU-hours at paper scale
    (last point in 2 000..400 000); elsewhere 100 geometrically spaced values from
    1/1000 to 2.5 times the largest compute (the paper's grid spans 1/160 to 2.5
    times its 16k GPU-hour runs; geometric spacing keeps small midpoints resolved).
    """
    spec = spec or GridSpec()
    if spec.A is not None:
        a0, a1, da = spec.A
    else:
        a0, a1, da = PAPER_A_GRID
        top = float(y.max())
        a0 = min(a0, max(0.0, math.floor((top - 0.1) / da) * da))
        a1 = max(a1, min(1.0, math.ceil((top + 0.1) / da) * da))
    if da <= 0 or a1 < a0:
        raise FitError(f"A grid (start={a0}, stop={a1}, step={da}) needs step > 0 and stop >= start")
    a_values = np.round(a0 + da * np.arange(int(round((a1 - a0) / da)) + 1), 10)
    cmax = float(x.max())
    if spec.C_mid is not None:
        lo, hi, n = spec.C_mid
        c_values = np.linspace(lo, hi, int(n))
    elif axis == "gpu_hours" and 2_000 <= cmax <= 400_000:
        c_values = np.linspace(*PAPER_C_MID_GRID)
    else:
        c_values = np.geomspace(cmax / 1000, 2.5 * cmax, PAPER_C_MID_GRID[2])
    if np.any(c_values <= 0):
        raise FitError("C_mid grid values must be > 0")
    return a_values, c_values



def _linear_ar0(s: np.ndarray, y: np.ndarray, A: float | None, R0: float | None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares A and R0 of y = R0 (1 - s) + A s, for s (..., n); fixed ones passed in."""
    if A is None and R0 is None:
        p, q = 1.0 - s, s
        spp, sqq, spq = (p * p).sum(-1), (q * q).sum(-1), (p * q).sum(-1)
        spy, sqy = (p * y).sum(-1), (q * y).sum(-1)
        det = spp * sqq - spq**2
        det = np.where(np.abs(det) < 1e-300, np.nan, det)
        return (spp * sqy - spq * spy) / det, (sqq * spy - spq * sqy) / det
    if A is None:
        a = R0 + ((y - R0) * s).sum(-1) / np.maximum((s * s).sum(-1), 1e-300)
        return a, np.full_like(a, R0)
    p = 1.0 - s
    r0 = ((y - A * s) * p).sum(-1) / np.maximum((p * p).sum(-1), 1e-300)
    return np.full_like(r0, A), r0


def _curve_s(theta: np.ndarray, logc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Model values and logistic fractions s: theta (m, 4), logc (n,) -> two (m, n)."""
    s = expit(theta[:, _B, None] * (logc - theta[:, _U, None]))
    return theta[:, _R0, None] + (theta[:, _A, None] - theta[:, _R0, None]) * s, s


def _jac_cols(theta: np.ndarray, logc: np.ndarray, s: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Columns ``idx`` of the Jacobian, from s of :func:`_curve_s`: -> (m, n, len(idx))."""
    amp = (theta[:, _A] - theta[:, _R0])[:, None]
    cols = []
    for i in idx:
        if i == _A:
            cols.append(s)
        elif i == _R0:
            cols.append(1.0 - s)
        else:
            ds = amp * s * (1.0 - s)
            cols.append(-ds * theta[:, _B, None] if i == _U else ds * (logc - theta[:, _U, None]))
    return np.stack(cols, axis=-1)


def _lm(theta: np.ndarray, free: np.ndarray, logc: np.ndarray, y: np.ndarray,
        lo: np.ndarray, hi: np.ndarray, w: np.ndarray | None = None, iters: int = 40,
        rtol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Projected Levenberg-Marquardt for many problems at once.

    theta (m, 4) start points; ``free`` (4,) bool mask of fitted parameters;
    y (m, n) or (n,) targets; w (m, n) weights or None; lo/hi (4,) bounds (steps
    are projected onto them).  A problem stops when an accepted step lowers its
    sum of squares by less than ``rtol`` (relative) or its damping exceeds 1e10.
    Returns the refined theta (m, 4) and the weighted sums of squared residuals (m,).
    """
    theta = np.array(theta, dtype=float)
    idx = np.flatnonzero(free)
    theta[:, idx] = np.clip(theta[:, idx], lo[idx], hi[idx])
    m = theta.shape[0]
    y = np.broadcast_to(y, (m,) + logc.shape)
    f, s = _curve_s(theta, logc)
    r = y - f
    ssr = (r * r if w is None else w * r * r).sum(-1)
    lam = np.full(m, 1e-3)
    eye = np.eye(idx.size)
    act = np.arange(m)
    for _ in range(iters):
        if act.size == 0:
            break
        th, wa = theta[act], None if w is None else w[act]
        J = _jac_cols(th, logc, s[act], idx)
        JWt = (J if wa is None else J * wa[..., None]).swapaxes(1, 2)
        # batched matmul, not einsum: numpy's einsum does not reach BLAS here (20x slower)
        H = JWt @ J
        g = (JWt @ r[act][..., None])[..., 0]
        diag = np.diagonal(H, axis1=1, axis2=2) + 1e-12
        la = lam[act]
        step = np.linalg.solve(H + la[:, None, None] * diag[:, :, None] * eye, g[..., None])[..., 0]
        trial = th.copy()
        trial[:, idx] = np.clip(th[:, idx] + step, lo[idx], hi[idx])
        f_t, s_t = _curve_s(trial, logc)
        r_t = y[act] - f_t
        ssr_t = (r_t * r_t if wa is None else wa * r_t * r_t).sum(-1)
        better = ssr_t < ssr[act]
        gain = (ssr[act] - ssr_t) / np.maximum(ssr[act], 1e-300)
        up = act[better]
        theta[up], r[up], s[up], ssr[up] = trial[better], r_t[better], s_t[better], ssr_t[better]
        la = np.where(better, la / 3.0, la * 4.0)
        lam[act] = la
        act = act[~((better & (gain < rtol)) | (la > 1e10))]
    return theta, ssr


def _fit_vp(logc, y, r0, a_fixed, lo, hi, w=None):
    """Coarse (C_mid, B) search with A, R0 solved linearly, then bounded least squares.

    ``w`` (n,) weights of the squared residuals (None: all 1); the linear solve of
    the coarse search ignores them (it only picks the start).
    """
    sw = np.ones_like(y) if w is None else np.sqrt(w)
    u_grid = np.linspace(lo[_U], hi[_U], 48)
    b_grid = np.geomspace(max(lo[_B], 0.3), min(hi[_B], 10.0), 24)
    uu, bb = (g.ravel() for g in np.meshgrid(u_grid, b_grid, indexing="ij"))
    best, theta0 = np.inf, None
    rows = block_rows(y.size)
    for j in range(0, uu.size, rows):         # blocks of grid points: memory rows x n, not 1152 x n
        u, b = uu[j:j + rows], bb[j:j + rows]
        s = expit(b[:, None] * (logc - u[:, None]))
        a, r = _linear_ar0(s, y, a_fixed, r0)
        a = np.clip(np.nan_to_num(a, nan=0.5), lo[_A], hi[_A])
        r = np.clip(np.nan_to_num(r, nan=0.0), lo[_R0], hi[_R0])
        ssr = ((((r[:, None] + (a - r)[:, None] * s) - y) * sw) ** 2).sum(-1)
        i = int(np.argmin(ssr))
        if ssr[i] < best:                      # strict: the first of equal minima, as one argmin
            best, theta0 = ssr[i], np.array([a[i], u[i], b[i], r[i]])
    free = np.array([a_fixed is None, True, True, r0 is None])
    idx = np.flatnonzero(free)

    def resid(p):
        t = theta0.copy()
        t[idx] = p
        return (_model(t, logc) - y) * sw

    def jac(p):
        t = theta0.copy()
        t[idx] = p
        return _jacobian(t, logc)[:, idx] * sw[:, None]

    res = least_squares(resid, theta0[idx], jac=jac, bounds=(lo[idx], hi[idx]),
                        method="trf", x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12)
    theta = theta0.copy()
    theta[idx] = res.x
    active = np.zeros(4, dtype=bool)
    active[idx] = res.active_mask != 0
    return theta, free, active


def _scan_sums(log_c_mid: np.ndarray, b_scan: np.ndarray, logc: np.ndarray, y: np.ndarray
               ) -> tuple[np.ndarray, ...]:
    """Sums over the points of s^2, s y, s p, p y and p^2 (s the logistic fraction at each
    C_mid and B, p = 1 - s), each (nc, nb), from blocks of C_mid values of at most
    :data:`GRID_BLOCK_ELEMENTS` elements (nb x n per C_mid value)."""
    parts = []
    rows = block_rows(b_scan.size * logc.size)
    for j in range(0, log_c_mid.size, rows):
        s = expit(b_scan[None, :, None] * (logc - log_c_mid[j:j + rows, None, None]))  # (rows, nb, n)
        p = 1.0 - s
        parts.append(((s * s).sum(-1), (s * y).sum(-1), (s * p).sum(-1), (p * y).sum(-1), (p * p).sum(-1)))
    return tuple(np.concatenate(k) for k in zip(*parts))


def _fit_grid(x, logc, y, r0, a_fixed, lo, hi, grid, axis, w=None):
    """Paper A.5: grid over (A, C_mid), least-squares B per pair, smallest SSR wins.

    ``w`` (n,) weights of the squared residuals in the refinement of B (the B scan
    that starts it is unweighted).

    B (and R0 when fitted) is solved for all pairs at once by the same least
    squares as ``scipy.optimize.curve_fit`` (started from the best of a B scan).
    """
    a_values, c_values = resolve_grid(grid, x, y, axis)
    if a_fixed is not None:
        a_values = np.array([a_fixed])
    aa, cc = np.meshgrid(a_values, c_values, indexing="ij")
    aa, uu = aa.ravel(), np.log(cc.ravel())
    b_scan = np.geomspace(max(lo[_B], 0.05), min(hi[_B], 20.0), 16)
    # Scan B with the sums that make up the SSR: s depends on (C_mid, B) only.
    ss, sy, sp, py, pp = _scan_sums(np.log(c_values), b_scan, logc, y)
    a = a_values[:, None, None]  # (na, 1, 1) against (nc, nb)
    if r0 is None:  # R0 solved linearly for each (A, C_mid, B) in the scan (unclipped)
        r = (py - a * sp) / np.maximum(pp, 1e-300)
    else:
        r = np.full((a.shape[0],) + ss.shape, r0)
    # SSR = sum (y - A s - R0 p)^2 expanded in the sums above.
    ssr = (float(y @ y) - 2 * a * sy - 2 * r * py + a * a * ss + 2 * a * r * sp + r * r * pp)
    j = np.argmin(ssr, axis=-1).ravel()  # best B per (A, C_mid) pair
    r = np.take_along_axis(r, j.reshape(ssr.shape[:2] + (1,)), axis=-1).ravel()
    theta0 = np.stack([aa, uu, b_scan[j], np.clip(r, lo[_R0], hi[_R0])], axis=1)
    free = np.array([False, False, True, r0 is None])
    block = block_rows(logc.size, 2 * GRID_BLOCK_ELEMENTS)
    parts = [_lm(theta0[i:i + block], free, logc, y, lo, hi, iters=40,
                 w=None if w is None else np.broadcast_to(w, (len(theta0[i:i + block]), w.size)))
             for i in range(0, len(theta0), block)]
    theta = np.concatenate([t for t, _ in parts])
    ssr = np.concatenate([q for _, q in parts])
    best = int(np.argmin(ssr))
    theta = theta[best]
    active = np.zeros(4, dtype=bool)
    active[_A] = a_fixed is None and (theta[_A] <= a_values[0] or theta[_A] >= a_values[-1])
    active[_U] = theta[_U] <= uu.min() or theta[_U] >= uu.max()
    return theta, np.array([a_fixed is None, True, True, r0 is None]), active, (a_values, c_values)

