"""The compute-scaling sigmoid of ScaleRL, its fit, intervals and warnings.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

(Khatri et al. 2025, "The Art of Scaling RL Compute for LLMs", arXiv 2510.13786,
eq. 1 in section 3; fitting procedure in appendix A.5).  ``C`` is training
compute on whatever axis the caller chooses (GPU-hours, FLOPs, tokens, steps);
``R`` is the validation pass rate (mean@k) in [0, 1].

Two fitting methods share one entry point, :func:`fit_sigmoid`:

* ``"vp"`` (default): a coarse search over (C_mid, B) in which (A, R0) are
  solved by linear least squares (the curve is linear in them: variable
  projection), polished by bounded ``scipy.optimize.least_squares`` in
  (A, log C_mid, B[, R0]).
* ``"grid"``: the paper's procedure (A.5): A on 0.450..0.800 step 0.005, C_mid
  on 100 linearly spaced values in [100, 40 000], B by least squares for each
  pair, smallest sum of squared residuals wins.

Intervals come from a residual bootstrap whose refits are warm-started
Levenberg-Marquardt steps run for all resamples at once (numpy), so 1 000
resamples cost about as much as a few scipy fits.  Nothing is clipped silently:
an estimate on a bound is reported as a flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit

# Order of the internal parameter vector theta: A, log C_mid, B, R0.
_A, _U, _B, _R0 = 0, 1, 2, 3
PARAM_NAMES = ("A", "C_mid", "B", "R0")

#: Paper, appendix A.5: A grid 0.450..0.800 step 0.005; C_mid 100 values in [100, 40000].
PAPER_A_GRID = (0.450, 0.800, 0.005)
PAPER_C_MID_GRID = (100.0, 40_000.0, 100)
#: Paper: the first ~1.5k GPU-hours (about one epoch) are left out of the fit.
PAPER_MIN_COMPUTE = 1_500.0
#: Below this many window points past C_mid the ceiling is not identified.
MIN_POINTS_PAST_MIDPOINT = 3
#: ... nor when the last point is below this multiple of C_mid.
MIN_REACH_PAST_MIDPOINT = 1.5
#: Fewer window points before C_mid than this: B and C_mid rest on R0 alone.
MIN_POINTS_BEFORE_MIDPOINT = 2
#: Fewer window points than this get a "too_few_points" flag.
MIN_POINTS = 6
TRUNCATION_THRESHOLD = 0.10


class FitError(ValueError):
    """Input that cannot be fitted (wrong shapes, values out of range, too few points)."""


@dataclass(frozen=True)
class Flag:
    """A warning attached to a fit: a stable ``code``, a message for people, and the
    parameter it concerns (A, B, C_mid, R0) when it concerns one."""

    code: str
    message: str
    param: str | None = None


@dataclass(frozen=True)
class Bounds:
    """Bounds of the bounded fit.  ``C_mid=None`` means 1e-4 to 1e2 times the largest compute."""

    A: tuple[float, float] = (0.0, 1.0)
    B: tuple[float, float] = (0.05, 20.0)
    C_mid: tuple[float, float] | None = None
    R0: tuple[float, float] = (0.0, 1.0)


@dataclass(frozen=True)
class GridSpec:
    """Grid of the ``"grid"`` method.

    ``A`` is (start, stop, step), inclusive; ``C_mid`` is (low, high, count), linearly
    spaced.  ``None`` picks the default (see :func:`resolve_grid`).
    """

    A: tuple[float, float, float] | None = None
    C_mid: tuple[float, float, int] | None = None


def sigmoid(C: Any, A: Any, B: Any, C_mid: Any, R0: Any) -> np.ndarray:
    """Pass rate predicted at compute ``C`` (paper eq. 1).

    ``C`` >= 0 (any shape; at C = 0 the curve equals R0); parameters broadcast
    against ``C``.  Computed as R0 + (A - R0) * expit(B (log C - log C_mid)),
    which equals the paper's form and never overflows.  Raises ValueError on
    negative compute.
    """
    C = np.asarray(C, dtype=float)
    if np.any(C < 0):
        raise ValueError("compute must be >= 0")
    with np.errstate(divide="ignore"):
        logc = np.log(C)
    return R0 + (np.asarray(A) - R0) * expit(np.asarray(B) * (logc - np.log(C_mid)))


def _model(theta: np.ndarray, logc: np.ndarray) -> np.ndarray:
    """theta (..., 4), logc (n,) -> (..., n)."""
    t = theta[..., None, :]
    return t[..., _R0] + (t[..., _A] - t[..., _R0]) * expit(t[..., _B] * (logc - t[..., _U]))


def _jacobian(theta: np.ndarray, logc: np.ndarray) -> np.ndarray:
    """d model / d theta: theta (..., 4), logc (n,) -> (..., n, 4)."""
    t = theta[..., None, :]
    d = logc - t[..., _U]
    s = expit(t[..., _B] * d)
    amp = t[..., _A] - t[..., _R0]
    ds = s * (1.0 - s)
    return np.stack([s, -amp * t[..., _B] * ds, amp * d * ds, 1.0 - s], axis=-1)


# ----------------------------------------------------------------------------- result


@dataclass(frozen=True)
class SigmoidFit:
    """One fitted curve (immutable).

    A: ceiling (pass rate); B: exponent; C_mid: midpoint (compute units of ``axis``);
    R0: pass rate at compute 0 (measured, fixed by the caller, or fitted when
    ``r0_fitted``).  ``window`` is the (min, max) compute of the points used,
    ``rmse`` the root mean squared residual on them.  ``intervals`` maps a parameter
    name to its (lo, hi) bootstrap interval at ``level``; each interval contains its
    estimate.  ``samples`` (bootstrap parameter draws, shape (n_bootstrap, 4) in
    the order A, C_mid, B, R0) and ``residuals`` are kept in memory for prediction
    bands but are not serialised.
    """

    A: float
    B: float
    C_mid: float
    R0: float
    r0_fitted: bool
    window: tuple[float, float]
    n_points: int
    rmse: float
    method: str
    axis: str = "gpu_hours"
    flags: tuple[Flag, ...] = ()
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    level: float = 0.95
    a_fixed: bool = False
    n_bootstrap: int = 0
    samples: np.ndarray | None = field(default=None, repr=False, compare=False, hash=False)
    residuals: np.ndarray | None = field(default=None, repr=False, compare=False, hash=False)

    def predict(self, C: Any) -> np.ndarray:
        """Pass rate predicted at compute ``C`` (same units as the fit's axis)."""
        return sigmoid(C, self.A, self.B, self.C_mid, self.R0)

    def has_flag(self, code: str) -> bool:
        """Whether a flag with this code is attached."""
        return any(f.code == code for f in self.flags)

    @property
    def flag_codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.flags)

    def interval(self, name: str) -> tuple[float, float] | None:
        """The (lo, hi) interval of ``name`` (A, B, C_mid, R0), or None if not computed."""
        iv = self.intervals.get(name)
        return None if iv is None else (float(iv[0]), float(iv[1]))

    def band(self, C: Any, kind: Literal["prediction", "confidence"] = "prediction",
             level: float | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Band of the curve at compute ``C`` from the bootstrap draws.

        ``"confidence"``: where the mean curve lies; ``"prediction"``: where a new
        evaluation point falls (curve draws plus resampled residual noise).
        Returns (lo, hi) arrays shaped like ``C``.  Raises ValueError when the
        fit was made without bootstrap.
        """
        if self.samples is None or len(self.samples) == 0:
            raise ValueError("this fit has no bootstrap draws: fit with bootstrap > 0 to get a band")
        level = self.level if level is None else level
        C = np.asarray(C, dtype=float)
        s = self.samples
        curves = sigmoid(C.reshape(1, -1), s[:, [0]], s[:, [2]], s[:, [1]], s[:, [3]])
        if kind == "prediction":
            rng = np.random.default_rng(seed)
            res = self.residuals if self.residuals is not None and len(self.residuals) else np.array([0.0])
            curves = curves + rng.choice(res, size=curves.shape, replace=True)
        elif kind != "confidence":
            raise ValueError(f"band kind {kind!r} is not one of: prediction, confidence")
        q = (1 - level) / 2
        lo, hi = np.quantile(curves, [q, 1 - q], axis=0)
        return lo.reshape(C.shape), hi.reshape(C.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (no bootstrap draws); :meth:`from_dict` reads it back."""
        return {
            "A": self.A, "B": self.B, "C_mid": self.C_mid, "R0": self.R0,
            "r0_fitted": self.r0_fitted, "window": list(self.window),
            "n_points": self.n_points, "rmse": self.rmse, "method": self.method,
            "axis": self.axis,
            "flags": [{"code": f.code, "message": f.message, "param": f.param} for f in self.flags],
            "intervals": {k: [float(v[0]), float(v[1])] for k, v in self.intervals.items()},
            "level": self.level, "a_fixed": self.a_fixed, "n_bootstrap": self.n_bootstrap,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SigmoidFit":
        """Inverse of :meth:`to_dict`.  Raises KeyError naming a missing field."""
        return cls(
            A=float(d["A"]), B=float(d["B"]), C_mid=float(d["C_mid"]), R0=float(d["R0"]),
            r0_fitted=bool(d["r0_fitted"]), window=(float(d["window"][0]), float(d["window"][1])),
            n_points=int(d["n_points"]), rmse=float(d["rmse"]), method=str(d["method"]),
            axis=str(d.get("axis", "gpu_hours")),
            flags=tuple(Flag(f["code"], f["message"], f.get("param")) for f in d.get("flags", [])),
            intervals={k: (float(v[0]), float(v[1])) for k, v in d.get("intervals", {}).items()},
            level=float(d.get("level", 0.95)), a_fixed=bool(d.get("a_fixed", False)),
            n_bootstrap=int(d.get("n_bootstrap", 0)),
        )


# ----------------------------------------------------------------------------- inputs


def default_min_compute(compute: Sequence[float], axis: str = "gpu_hours") -> float:
    """Default start of the fit window.

    Paper scale (GPU-hours, last point >= 10k): 1 500 GPU-hours (A.5).  Otherwise
    the same share of the run the paper drops from its 100k GPU-hour run: 1.5 %
    of the largest compute.
    """
    cmax = float(np.max(compute)) if len(compute) else 0.0
    if axis == "gpu_hours" and cmax >= 10_000:
        return PAPER_MIN_COMPUTE
    return 0.015 * cmax


def _as_arrays(compute: Any, pass_rate: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(compute, dtype=float).ravel()
    y = np.asarray(pass_rate, dtype=float).ravel()
    if x.shape != y.shape:
        raise FitError(f"compute has {x.size} values but pass_rate has {y.size}: they must pair up")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise FitError("compute and pass_rate must be finite numbers (found NaN or inf)")
    if np.any(x < 0):
        raise FitError(f"compute must be >= 0 (smallest given: {x.min():g})")
    if np.any((y < 0) | (y > 1)):
        raise FitError(f"pass_rate must lie in [0, 1] (given range {y.min():g}..{y.max():g})")
    return x, y


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


# ----------------------------------------------------------------------------- solvers


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
    w = np.ones((m,) + logc.shape) if w is None else w
    f, s = _curve_s(theta, logc)
    r = y - f
    ssr = (w * r * r).sum(-1)
    lam = np.full(m, 1e-3)
    eye = np.eye(idx.size)
    act = np.arange(m)
    for _ in range(iters):
        if act.size == 0:
            break
        th, wa = theta[act], w[act]
        J = _jac_cols(th, logc, s[act], idx)
        JW = J * wa[..., None]
        H = np.einsum("mnk,mnl->mkl", JW, J)
        g = np.einsum("mnk,mn->mk", JW, r[act])
        diag = np.einsum("mkk->mk", H) + 1e-12
        la = lam[act]
        step = np.linalg.solve(H + la[:, None, None] * diag[:, :, None] * eye, g[..., None])[..., 0]
        trial = th.copy()
        trial[:, idx] = np.clip(th[:, idx] + step, lo[idx], hi[idx])
        f_t, s_t = _curve_s(trial, logc)
        r_t = y[act] - f_t
        ssr_t = (wa * r_t * r_t).sum(-1)
        better = ssr_t < ssr[act]
        gain = (ssr[act] - ssr_t) / np.maximum(ssr[act], 1e-300)
        up = act[better]
        theta[up], r[up], s[up], ssr[up] = trial[better], r_t[better], s_t[better], ssr_t[better]
        la = np.where(better, la / 3.0, la * 4.0)
        lam[act] = la
        act = act[~((better & (gain < rtol)) | (la > 1e10))]
    return theta, ssr


def _fit_vp(logc, y, r0, a_fixed, lo, hi):
    """Coarse (C_mid, B) search with A, R0 solved linearly, then bounded least squares."""
    u_grid = np.linspace(lo[_U], hi[_U], 48)
    b_grid = np.geomspace(max(lo[_B], 0.3), min(hi[_B], 10.0), 24)
    uu, bb = np.meshgrid(u_grid, b_grid, indexing="ij")
    s = expit(bb[..., None] * (logc - uu[..., None]))
    a, r = _linear_ar0(s, y, a_fixed, r0)
    a = np.clip(np.nan_to_num(a, nan=0.5), lo[_A], hi[_A])
    r = np.clip(np.nan_to_num(r, nan=0.0), lo[_R0], hi[_R0])
    ssr = (((r[..., None] + (a - r)[..., None] * s) - y) ** 2).sum(-1)
    i = np.unravel_index(np.argmin(ssr), ssr.shape)
    theta0 = np.array([a[i], uu[i], bb[i], r[i]])
    free = np.array([a_fixed is None, True, True, r0 is None])
    idx = np.flatnonzero(free)

    def resid(p):
        t = theta0.copy()
        t[idx] = p
        return _model(t, logc) - y

    def jac(p):
        t = theta0.copy()
        t[idx] = p
        return _jacobian(t, logc)[:, idx]

    res = least_squares(resid, theta0[idx], jac=jac, bounds=(lo[idx], hi[idx]),
                        method="trf", x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12)
    theta = theta0.copy()
    theta[idx] = res.x
    active = np.zeros(4, dtype=bool)
    active[idx] = res.active_mask != 0
    return theta, free, active


def _fit_grid(x, logc, y, r0, a_fixed, lo, hi, grid, axis):
    """Paper A.5: grid over (A, C_mid), least-squares B per pair, smallest SSR wins.

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
    s = expit(b_scan[None, :, None] * (logc - np.log(c_values)[:, None, None]))  # (nc, nb, n)
    p = 1.0 - s
    ss, sy, sp, py, pp = ((s * s).sum(-1), (s * y).sum(-1), (s * p).sum(-1), (p * y).sum(-1),
                          (p * p).sum(-1))
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
    block = max(1, 2_000_000 // max(logc.size, 1))
    parts = [_lm(theta0[i:i + block], free, logc, y, lo, hi, iters=40)
             for i in range(0, len(theta0), block)]
    theta = np.concatenate([t for t, _ in parts])
    ssr = np.concatenate([q for _, q in parts])
    best = int(np.argmin(ssr))
    theta = theta[best]
    active = np.zeros(4, dtype=bool)
    active[_A] = a_fixed is None and (theta[_A] <= a_values[0] or theta[_A] >= a_values[-1])
    active[_U] = theta[_U] <= uu.min() or theta[_U] >= uu.max()
    return theta, np.array([a_fixed is None, True, True, r0 is None]), active, (a_values, c_values)


# ----------------------------------------------------------------------------- flags


def detect_late_decline(compute: np.ndarray, pass_rate: np.ndarray, tol: float = 0.02
                        ) -> Flag | None:
    """Flag a collapse after a peak (method.md section 7: unstable runs break the sigmoid).

    The mean of the last fifth of the points (at least 3) is compared with the
    peak of a running median of 3 over the points before them; a drop larger than
    max(tol, 4 x noise sd) is a late decline.  The noise sd is estimated from the
    median absolute difference of successive points.  compute, pass_rate: (n,).
    """
    order = np.argsort(compute)
    x, y = compute[order], pass_rate[order]
    n = y.size
    k = max(3, n // 5)
    if n < k + 3:
        return None
    body = np.lib.stride_tricks.sliding_window_view(y[:-k], 3)
    smooth = np.median(body, axis=1)
    j = int(np.argmax(smooth))
    peak, tail = float(smooth[j]), float(y[-k:].mean())
    noise = float(np.median(np.abs(np.diff(y)))) / (0.6745 * math.sqrt(2))
    if peak - tail > max(tol, 4 * noise):
        return Flag("late_decline",
                    f"pass rate falls after a peak of {peak:.3f} near compute {x[j + 1]:.4g} "
                    f"to {tail:.3f} over the last {k} points: the run may be unstable and the "
                    "sigmoid does not describe it")
    return None


def _on_bound(value: float, lo: float, hi: float, rel: float = 1e-3) -> str | None:
    tol = rel * (hi - lo)
    if value - lo <= tol:
        return "lower"
    if hi - value <= tol:
        return "upper"
    return None


def _point_flags(theta, free, active, lo, hi, xw, yw, truncation, threshold, grid_values):
    flags: list[Flag] = []
    shown = {_A: ("A", lambda v: f"{v:.3f}"), _U: ("C_mid", lambda v: f"{math.exp(v):.4g}"),
             _B: ("B", lambda v: f"{v:.3g}"), _R0: ("R0", lambda v: f"{v:.3f}")}
    for i in np.flatnonzero(free):
        if grid_values is not None and i in (_A, _U):
            vals = grid_values[0] if i == _A else np.log(grid_values[1])
            side = "lower" if theta[i] <= vals.min() else "upper" if theta[i] >= vals.max() else None
            what, lo_i, hi_i = "grid", vals.min(), vals.max()
        else:
            side = "upper" if active[i] and theta[i] > (lo[i] + hi[i]) / 2 else "lower" if active[i] else None
            side = side or _on_bound(theta[i], lo[i], hi[i])
            what, lo_i, hi_i = "bound", lo[i], hi[i]
        if side:
            name, fmt = shown[i]
            edge = lo_i if side == "lower" else hi_i
            flags.append(Flag("on_bound", f"{name} = {fmt(theta[i])} lies on the {side} {what} edge "
                                          f"({fmt(edge)}): the estimate is not trustworthy", name))
    c_mid = math.exp(theta[_U])
    past = int(np.sum(xw > c_mid))
    reach = float(xw.max()) / c_mid
    if past < MIN_POINTS_PAST_MIDPOINT or reach < MIN_REACH_PAST_MIDPOINT:
        flags.append(Flag("ceiling_not_identified",
                          f"{past} points lie past the midpoint C_mid = {c_mid:.4g} and the last "
                          f"is at {reach:.2f} x C_mid (need >= {MIN_POINTS_PAST_MIDPOINT} points and "
                          f">= {MIN_REACH_PAST_MIDPOINT} x C_mid): A trades off against C_mid and B; "
                          "extend the run"))
    before = int(np.sum(xw < c_mid))
    if before < MIN_POINTS_BEFORE_MIDPOINT:
        flags.append(Flag("rise_not_identified",
                          f"{before} points of the window lie before the midpoint C_mid = "
                          f"{c_mid:.4g}: B and C_mid rest on R0 alone; start the window earlier"))
    if xw.size < MIN_POINTS:
        flags.append(Flag("too_few_points", f"only {xw.size} points in the fit window "
                                            f"(fewer than {MIN_POINTS})"))
    decline = detect_late_decline(xw, yw)
    if decline:
        flags.append(decline)
    if truncation is not None and truncation.size and np.any(np.isfinite(truncation)):
        top = float(np.nanmax(truncation))
        if top > threshold:
            flags.append(Flag("truncation", f"truncation rate reached {top:.3f} (threshold "
                                             f"{threshold:.2f}): runs past 0.10-0.15 became unstable "
                                             "in the paper"))
    return flags


# ----------------------------------------------------------------------------- bootstrap


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


def _to_named(theta: np.ndarray) -> np.ndarray:
    """(..., 4) internal (A, log C_mid, B, R0) -> (A, C_mid, B, R0)."""
    out = np.array(theta, dtype=float)
    out[..., _U] = np.exp(out[..., _U])
    return out


# ----------------------------------------------------------------------------- fit


def fit_sigmoid(
    compute: Sequence[float] | np.ndarray,
    pass_rate: Sequence[float] | np.ndarray,
    *,
    min_compute: float = 0.0,
    r0: Literal["auto", "measured", "fit"] | float = "auto",
    method: Literal["vp", "grid"] = "vp",
    axis: str = "gpu_hours",
    fixed_A: float | None = None,
    bootstrap: int = 1000,
    bootstrap_kind: Literal["residual", "pairs"] = "residual",
    level: float = 0.95,
    seed: int = 0,
    truncation: Sequence[float] | np.ndarray | None = None,
    truncation_threshold: float = TRUNCATION_THRESHOLD,
    bounds: Bounds | None = None,
    grid: GridSpec | None = None,
) -> SigmoidFit:
    """Fit R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to evaluation points.

    compute (n,): compute of each point on ``axis`` (GPU-hours, FLOPs, tokens or
    steps), >= 0.  pass_rate (n,): mean@k in [0, 1].  Points with compute >=
    ``min_compute`` (and > 0) form the fit window (paper A.5 drops the first ~1.5k
    GPU-hours; see :func:`default_min_compute`).

    r0: ``"auto"`` uses the measured pass rate at compute 0 (mean of such points)
    when there is one and fits R0 otherwise; ``"measured"`` requires the point;
    ``"fit"`` fits it; a float fixes it.  ``fixed_A`` holds the ceiling fixed (used
    by the tie rule of :mod:`scalectl.compare`).

    method: ``"vp"`` (bounded least squares from a variable-projection start) or
    ``"grid"`` (paper A.5).  ``bootstrap`` resamples (0 for none) give intervals at
    ``level``, deterministic given ``seed``.  ``truncation`` (n,) truncation rates,
    flagged above ``truncation_threshold`` (method.md section 5).

    Returns a :class:`SigmoidFit`.  Raises :class:`FitError` on malformed input or
    when the window holds too few points.
    """
    x, y = _as_arrays(compute, pass_rate)
    if method not in ("vp", "grid"):
        raise FitError(f"fit method {method!r} is not one of: vp, grid")
    if not 0.0 < level < 1.0:
        raise FitError(f"interval level must lie strictly between 0 and 1 (given {level})")
    if bootstrap < 0:
        raise FitError(f"bootstrap must be >= 0 (given {bootstrap})")
    bounds = bounds or Bounds()
    zero = x == 0
    if isinstance(r0, str):
        if r0 not in ("auto", "measured", "fit"):
            raise FitError(f"r0 {r0!r} is not one of: auto, measured, fit, or a number in [0, 1]")
        if r0 == "measured" and not zero.any():
            raise FitError("r0 = 'measured' needs an evaluation at compute 0; none given "
                           "(use r0 = 'fit')")
        mode = "measured" if (r0 == "auto" and zero.any()) or r0 == "measured" else "fit"
        R0 = float(y[zero].mean()) if mode == "measured" else None
    else:
        if not 0.0 <= float(r0) <= 1.0:
            raise FitError(f"r0 must lie in [0, 1] (given {r0})")
        mode, R0 = "given", float(r0)
    win = (x >= min_compute) & (x > 0)
    xw, yw = x[win], y[win]
    n_free = 2 + (fixed_A is None) + (R0 is None)
    if xw.size < n_free + 1:
        raise FitError(f"the fit window (compute >= {min_compute:g}) holds {xw.size} points; "
                       f"at least {n_free + 1} are needed to fit {n_free} parameters")
    if fixed_A is not None and not bounds.A[0] <= fixed_A <= bounds.A[1]:
        raise FitError(f"fixed A = {fixed_A} lies outside the A bounds {bounds.A}")
    cmax = float(xw.max())
    cb = bounds.C_mid or (cmax * 1e-4, cmax * 1e2)
    if not 0 < cb[0] < cb[1] or not bounds.B[0] > 0:
        raise FitError(f"bounds need 0 < C_mid low < C_mid high and B low > 0 (given {bounds})")
    r0_bounds = bounds.R0 if R0 is None else (-1.0, 2.0)
    lo = np.array([bounds.A[0], math.log(cb[0]), bounds.B[0], r0_bounds[0]])
    hi = np.array([bounds.A[1], math.log(cb[1]), bounds.B[1], r0_bounds[1]])
    logc = np.log(xw)
    trunc = None if truncation is None else np.asarray(truncation, dtype=float).ravel()
    if trunc is not None and trunc.size != x.size:
        raise FitError(f"truncation has {trunc.size} values but compute has {x.size}")

    grid_values = None
    if method == "vp":
        theta, free, active = _fit_vp(logc, yw, R0, fixed_A, lo, hi)
    else:
        theta, free, active, grid_values = _fit_grid(xw, logc, yw, R0, fixed_A, lo, hi, grid, axis)
    if fixed_A is not None:
        theta[_A], free[_A] = fixed_A, False
    if R0 is not None:
        theta[_R0] = R0
    resid = yw - _model(theta, logc)
    flags = _point_flags(theta, free, active, lo, hi, xw, yw, trunc, truncation_threshold,
                         grid_values)

    intervals: dict[str, tuple[float, float]] = {}
    samples = None
    if bootstrap:
        n0 = int(zero.sum()) if mode == "measured" else 0
        draws = _bootstrap(theta, free, logc, yw, resid, n0, lo, hi, bootstrap, seed,
                           bootstrap_kind)
        samples = _to_named(draws)
        point = _to_named(theta)
        q = (1 - level) / 2
        varied = free.copy()
        varied[_R0] |= n0 > 0
        for i in np.flatnonzero(varied):
            a, b = np.quantile(samples[:, i], [q, 1 - q])
            intervals[PARAM_NAMES[i]] = (float(min(a, point[i])), float(max(b, point[i])))
        for i in np.flatnonzero(free):
            tol = 1e-3 * (hi[i] - lo[i])
            share = float(np.mean((draws[:, i] - lo[i] <= tol) | (hi[i] - draws[:, i] <= tol)))
            if share > 1 - level:
                flags.append(Flag("interval_on_bound",
                                  f"{share:.0%} of bootstrap refits put {PARAM_NAMES[i]} on a "
                                  "bound: its interval is cut by the bound and too narrow",
                                  PARAM_NAMES[i]))
        c_hi = intervals["C_mid"][1]
        if c_hi > cmax and not any(f.code == "ceiling_not_identified" for f in flags):
            flags.append(Flag("ceiling_not_identified",
                              f"the {level:.0%} interval of C_mid reaches {c_hi:.4g}, past the last "
                              f"point ({cmax:.4g}): the midpoint, hence the ceiling, is not pinned down"))

    return SigmoidFit(
        A=float(theta[_A]), B=float(theta[_B]), C_mid=float(math.exp(theta[_U])),
        R0=float(theta[_R0]), r0_fitted=R0 is None, window=(float(xw.min()), cmax),
        n_points=int(xw.size), rmse=float(np.sqrt(np.mean(resid**2))), method=method,
        axis=axis, flags=tuple(flags), intervals=intervals, level=level,
        a_fixed=fixed_A is not None, n_bootstrap=int(bootstrap), samples=samples,
        residuals=resid,
    )


# ----------------------------------------------------------------------------- reading fits


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


def advise(fit: SigmoidFit, margin: float = 0.02, n_seeds: int = 1) -> Advice:
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
        return Advice("extend", width, margin,
                      f"A interval width {width:.3f} exceeds the margin {margin:.3f} and the data "
                      f"stop at {reach:.2f} x C_mid: extend the run to about 3 x C_mid "
                      f"({3 * fit.C_mid:.4g}); more seeds would not pin the ceiling")
    need = max(n_seeds + 1, math.ceil(n_seeds * (width / margin) ** 2))
    return Advice("seeds", width, margin,
                  f"A interval width {width:.3f} exceeds the margin {margin:.3f} although the data "
                  f"reach {reach:.2f} x C_mid: the width is noise; about {need} seeds (or more "
                  "evaluation prompts) would bring it within the margin", seeds_needed=need)
