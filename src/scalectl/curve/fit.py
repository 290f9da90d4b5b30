"""Fitting the sigmoid to evaluation points: :func:`fit_sigmoid`, its window and flags.

Khatri et al. 2025 (arXiv 2510.13786), eq. 1 and appendix A.5.  The solvers are
in :mod:`scalectl.curve.solvers`, the bootstrap behind the intervals in
:mod:`scalectl.curve.bootstrap`, the profile likelihood that says whether the
points identify the ceiling in :mod:`scalectl.curve.profile`.  Nothing is clipped silently: an estimate on a
bound is reported as a flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, Sequence

import numpy as np

from scalectl.curve.bootstrap import KINDS, bootstrap_draws
from scalectl.curve.model import (_A, _B, _R0, _U, MIN_POINTS, MIN_POINTS_BEFORE_MIDPOINT,
                                  MIN_POINTS_PAST_MIDPOINT, MIN_REACH_PAST_MIDPOINT, PARAM_NAMES,
                                  PAPER_MIN_COMPUTE, TRUNCATION_THRESHOLD, Bounds, FitError, Flag,
                                  GridSpec, SigmoidFit, _model, _to_named)
from scalectl.curve.profile import CeilingProfile, profile_ceiling
from scalectl.curve.solvers import _fit_grid, _fit_vp


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


#: Lag-1 autocorrelation of the residuals is clipped to [0, MAX_AUTOCORR] before use.
MAX_AUTOCORR = 0.9


def ar1_inflation(residuals: np.ndarray) -> tuple[float, float]:
    """(rho, factor): the lag-1 autocorrelation of residuals in compute order, clipped to
    [0, 0.9], and the sd inflation sqrt((1 + rho) / (1 - rho)).

    For noise with lag-1 autocorrelation rho, n points carry the information of
    n (1 - rho) / (1 + rho) independent ones (the effective sample size of an
    AR(1) series: Zwiers and von Storch 1995, J. Climate 8, eq. 4; Bretherton et
    al. 1999, J. Climate 12): variances estimated as if independent are too small
    by that ratio.  Fewer than 4 residuals: (0, 1).
    """
    r = np.asarray(residuals, dtype=float)
    if r.size < 4:
        return 0.0, 1.0
    r = r - r.mean()
    den = float(np.sum(r * r))
    rho = float(np.sum(r[1:] * r[:-1])) / den if den > 0 else 0.0
    rho = min(max(rho, 0.0), MAX_AUTOCORR)
    return rho, math.sqrt((1 + rho) / (1 - rho))


def evaluation_standard_error(correct_counts: Sequence[int], k: int) -> float | None:
    """Standard error of a mean@k pass rate from a re-evaluation of the same prompts.

    correct_counts (n_prompts,): correct samples of each prompt out of ``k``.  Each
    prompt's rate c/k is binomial, so var(mean) = sum p_i (1 - p_i) / k / n^2 (the
    prompt set is fixed; only the sampling varies).  None when there is nothing to
    compute it from (no prompts, k < 1); at least 0.5 / (n k) so that a pass rate of
    0 or 1 keeps a nonzero error.
    """
    c = np.asarray(list(correct_counts or []), dtype=float)
    if c.size == 0 or not k or k < 1:
        return None
    p = c / k
    se = math.sqrt(float(np.sum(p * (1 - p))) / k) / c.size
    return max(se, 0.5 / (c.size * k))


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



def detect_late_decline(compute: np.ndarray, pass_rate: np.ndarray, tol: float = 0.02
                        ) -> Flag | None:
    """Flag a collapse after a peak (docs/method.md, section 7: unstable runs break the sigmoid).

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
                          f"{past} point{'' if past == 1 else 's'} lie{'s' if past == 1 else ''} past the midpoint C_mid = {c_mid:.4g} and the last "
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



@dataclass(frozen=True)
class FitSettings:
    """The settings of :func:`fit_sigmoid` (its keyword arguments), checked when made.

    min_compute: the fit window starts there: points with compute >= ``min_compute`` (and >
    0) are fitted (paper A.5 drops the first ~1.5k GPU-hours; see :func:`default_min_compute`).

    r0: ``"auto"`` uses the measured pass rate at compute 0 when there is one and fits R0
    otherwise; ``"measured"`` requires the point; ``"fit"`` fits it from the curve alone; a
    float in [0, 1] fixes it.  A measured R0 is not held fixed: each point at compute 0
    enters the least squares as one more observation of the curve (whose value there is
    R0), with the same noise as every other evaluation, so a noisy step-0 evaluation moves A
    only as much as its weight among the points allows, and R0 gets a bootstrap interval
    inside its bounds [0, 1].  ``fixed_A`` holds the ceiling fixed (used by the tie rule of
    :mod:`scalectl.science.compare`).

    r0_se: the standard error of the evaluation(s) at compute 0 (e.g. binomial,
    sqrt(p (1 - p) / samples)).  When given, each such observation is weighted by sigma^2 /
    r0_se^2 against the window points, sigma being their residual sd (generalised least
    squares, reweighted until the weight settles), and the bootstrap redraws it from N(R0,
    r0_se^2).  Without it, it weighs as one more point.

    method: ``"vp"`` (bounded least squares from a variable-projection start) or ``"grid"``
    (paper A.5; ``grid`` its :class:`GridSpec`).  ``bootstrap`` resamples (0 for none) give
    intervals at ``level``, deterministic given ``seed``; ``bootstrap_kind`` and ``block`` as
    in :func:`scalectl.curve.bootstrap.bootstrap_draws`.  ``dependence``: real evaluation
    points drift together (a dip spans several points), so the resampled residuals and the
    prediction noise are inflated by the lag-1 autocorrelation of the residuals
    (:func:`ar1_inflation`); False treats the points as independent.  Truncation rates are
    flagged above ``truncation_threshold`` (docs/method.md, section 5).  ``bounds``: of the
    bounded fit (:class:`Bounds`); ``axis``: the compute axis, recorded in the fit.

    Raises:
        FitError: a method, level, bootstrap count or kind, r0_se or r0 out of range.
    """

    min_compute: float = 0.0
    r0: Literal["auto", "measured", "fit"] | float = "auto"
    method: Literal["vp", "grid"] = "vp"
    axis: str = "gpu_hours"
    fixed_A: float | None = None
    bootstrap: int = 1000
    bootstrap_kind: Literal["block", "residual", "pairs"] = "residual"
    dependence: bool = True
    block: int | None = None
    r0_se: float | None = None
    level: float = 0.95
    seed: int = 0
    truncation_threshold: float = TRUNCATION_THRESHOLD
    bounds: Bounds | None = None
    grid: GridSpec | None = None

    def __post_init__(self):
        if self.method not in ("vp", "grid"):
            raise FitError(f"fit method {self.method!r} is not one of: vp, grid")
        if not 0.0 < self.level < 1.0:
            raise FitError(f"interval level must lie strictly between 0 and 1 (given {self.level})")
        if self.bootstrap < 0:
            raise FitError(f"bootstrap must be >= 0 (given {self.bootstrap})")
        if self.bootstrap_kind not in KINDS:
            raise FitError(f"bootstrap kind {self.bootstrap_kind!r} is not one of: {', '.join(KINDS)}")
        if self.r0_se is not None and not self.r0_se > 0:
            raise FitError(f"r0_se must be > 0 (given {self.r0_se})")
        if isinstance(self.r0, str):
            if self.r0 not in ("auto", "measured", "fit"):
                raise FitError(f"r0 {self.r0!r} is not one of: auto, measured, fit, or a number in [0, 1]")
        elif not 0.0 <= float(self.r0) <= 1.0:
            raise FitError(f"r0 must lie in [0, 1] (given {self.r0})")


def fit_sigmoid(compute: Sequence[float] | np.ndarray, pass_rate: Sequence[float] | np.ndarray, *,
                truncation: Sequence[float] | np.ndarray | None = None, settings: FitSettings | None = None,
                **options: Any) -> SigmoidFit:
    """Fit R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to evaluation points (paper eq. 1, A.5).

    compute (n,): compute of each point on the settings' ``axis`` (GPU-hours, FLOPs, tokens
    or steps), >= 0.  pass_rate (n,): mean@k in [0, 1].  truncation (n,): truncation rates,
    flagged above the threshold.  ``options`` are the fields of :class:`FitSettings`
    (``min_compute=1500``, ``bootstrap=0``, ...), set over ``settings`` when both are given.

    The steps: the points sorted by compute and R0's mode (:func:`_r0_mode`), the window
    (:func:`_window`), the least squares (:func:`_solve`), the residual noise
    (:func:`_noise`), the flags of the point estimate (:func:`_point_flags`), the profile of
    A and its flags (:func:`scalectl.curve.profile.profile_ceiling`, :func:`_profile_flags`:
    the ceiling is not identified when curves within the noise reach a bound of A or bend too
    late for the points) and the bootstrap intervals with their flags (:func:`_intervals`).

    Returns a :class:`SigmoidFit`.  Raises :class:`FitError` on malformed input or settings,
    or when the window holds too few points; TypeError on an unknown option.
    """
    x, y = _as_arrays(compute, pass_rate)
    order = np.argsort(x, kind="stable")   # blocks of the bootstrap follow compute
    x, y = x[order], y[order]
    s = replace(settings, **options) if settings is not None else FitSettings(**options)
    mode, R0 = _r0_mode(s.r0, x == 0)
    win = _window(x, y, truncation, order, mode, R0, s)
    theta, free, active, grid_values, w = _solve(win, s)
    resid, rho, inflate, dof, noise_sd = _noise(theta, free, win, s.dependence)
    flags = _point_flags(theta, free, active, win.lo, win.hi, win.xw, win.yw, win.trunc, s.truncation_threshold,
                         grid_values)
    profile = None
    if s.fixed_A is None:
        profile = profile_ceiling(theta, win.logc, win.yf, w, win.n0, win.R0, win.lo, win.hi,
                                  noise_sd ** 2, dof, s.level)
        flags.extend(_profile_flags(profile, win.xw, flags))
    intervals, samples = _intervals(theta, free, win, resid, w, inflate, s, flags, profile)
    return SigmoidFit(
        A=float(theta[_A]), B=float(theta[_B]), C_mid=float(math.exp(theta[_U])),
        R0=float(theta[_R0]), r0_fitted=mode == "fit", r0_measured=mode == "measured",
        window=(float(win.xw.min()), win.cmax),
        n_points=int(win.xw.size), rmse=float(np.sqrt(np.mean(resid[win.n0:]**2))), method=s.method,
        axis=s.axis, flags=tuple(flags), intervals=intervals, level=s.level,
        a_fixed=s.fixed_A is not None, n_bootstrap=int(s.bootstrap), samples=samples,
        residuals=resid[win.n0:], noise_sd=noise_sd, dof=dof, autocorr=rho,
        a_profile=None if profile is None else profile.interval,
    )


def _r0_mode(r0, zero: np.ndarray) -> tuple[str, float | None]:
    """How R0 is found: ("measured", None) from the points at compute 0 (``zero``, (n,) bool),
    ("fit", None) from the curve, or ("given", R0)."""
    if isinstance(r0, str):
        if r0 == "measured" and not zero.any():
            raise FitError("r0 = 'measured' needs an evaluation at compute 0; none given "
                           "(use r0 = 'fit')")
        return ("measured" if (r0 == "auto" and zero.any()) or r0 == "measured" else "fit"), None
    return "given", float(r0)


@dataclass(frozen=True)
class _Window:
    """The points a fit solves for.  xw, yw (m,): the window (compute > 0, >= min_compute);
    n0: observations of R0 (points at compute 0, when R0 is measured); logc, yf (n0 + m,):
    log compute (the R0 observations far below the window) and pass rate of every
    observation; lo, hi (4,): bounds of (A, log C_mid, B, R0); cmax: the window's last
    compute; R0: a given R0, else None; trunc (n,) truncation rates in compute order, or None."""

    xw: np.ndarray
    yw: np.ndarray
    n0: int
    logc: np.ndarray
    yf: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    cmax: float
    R0: float | None
    trunc: np.ndarray | None


def _window(x: np.ndarray, y: np.ndarray, truncation, order: np.ndarray, mode: str, R0: float | None,
            s: FitSettings) -> _Window:
    """The fit window of the sorted points ``x``, ``y`` (n,), its observations and bounds.

    Raises:
        FitError: too few points for the parameters, a fixed A outside its bounds, bounds
            out of order, or truncation rates not one per point.
    """
    bounds = s.bounds or Bounds()
    zero = x == 0
    win = (x >= s.min_compute) & (x > 0)
    xw, yw = x[win], y[win]
    n0 = int(zero.sum()) if mode == "measured" else 0
    n_free = 2 + (s.fixed_A is None) + (R0 is None)
    if xw.size + n0 < n_free + 1 or xw.size < 2:
        where = "compute > 0" if s.min_compute <= 0 else f"compute >= {s.min_compute:g}"
        raise FitError(f"the fit window ({where}) holds {xw.size} point{'' if xw.size == 1 else 's'}; "
                       f"at least {n_free + 1 - n0} are needed to fit {n_free} parameters"
                       + (f" (the {n0} at compute 0 give{'s' if n0 == 1 else ''} R0)" if n0 else ""))
    if s.fixed_A is not None and not bounds.A[0] <= s.fixed_A <= bounds.A[1]:
        raise FitError(f"fixed A = {s.fixed_A} lies outside the A bounds {bounds.A}")
    cmax = float(xw.max())
    cb = bounds.C_mid or (cmax * 1e-4, cmax * 1e2)
    if not 0 < cb[0] < cb[1] or not bounds.B[0] > 0:
        raise FitError(f"bounds need 0 < C_mid low < C_mid high and B low > 0 (given {bounds})")
    r0_bounds = bounds.R0 if R0 is None else (-1.0, 2.0)
    lo = np.array([bounds.A[0], math.log(cb[0]), bounds.B[0], r0_bounds[0]])
    hi = np.array([bounds.A[1], math.log(cb[1]), bounds.B[1], r0_bounds[1]])
    # Points at compute 0 observe R0: log C far below the window puts them at s = 0.
    logc = np.concatenate([np.full(n0, math.log(xw.min()) - 1000.0), np.log(xw)])
    yf = np.concatenate([y[zero] if n0 else np.empty(0), yw])
    trunc = None if truncation is None else np.asarray(truncation, dtype=float).ravel()
    if trunc is not None and trunc.size != x.size:
        raise FitError(f"truncation has {trunc.size} values but compute has {x.size}")
    return _Window(xw, yw, n0, logc, yf, lo, hi, cmax, R0, None if trunc is None else trunc[order])


def _solve(win: _Window, s: FitSettings):
    """The least squares of :data:`FitSettings.method` over the window: (theta (4,), free (4,)
    bool, active (4,) bool, the grid's values or None, weights (n0 + m,)).  With a known
    ``r0_se``, the R0 observations are reweighted by (window noise / their standard error)^2
    until the weight settles (the window noise depends on the fit it weights)."""
    w = np.ones(win.yf.size)

    def solve(w):
        if s.method == "vp":
            return (*_fit_vp(win.logc, win.yf, win.R0, s.fixed_A, win.lo, win.hi, w), None)
        return _fit_grid(win.xw, win.logc, win.yf, win.R0, s.fixed_A, win.lo, win.hi, s.grid, s.axis, w)

    theta, free, active, grid_values = solve(w)
    n0 = win.n0
    for _ in range(4 if n0 and s.r0_se is not None else 0):
        rw = win.yw - _model(theta, win.logc[n0:])
        sigma2 = float(np.sum(rw**2)) / max(win.xw.size - int(free.sum()), 1)
        w0 = min(max(sigma2 / s.r0_se**2, 1e-6), 1e6)
        if abs(w0 - w[0]) <= 0.01 * w[0]:
            break
        w[:n0] = w0
        theta, free, active, grid_values = solve(w)
    if s.fixed_A is not None:
        theta[_A], free[_A] = s.fixed_A, False
    if win.R0 is not None:
        theta[_R0] = win.R0
    return theta, free, active, grid_values, w


def _noise(theta: np.ndarray, free: np.ndarray, win: _Window, dependence: bool):
    """(residuals (n0 + m,), lag-1 autocorrelation, sd inflation, degrees of freedom, noise
    sd of one evaluation point) of the fitted curve (:func:`ar1_inflation` with ``dependence``)."""
    resid = win.yf - _model(theta, win.logc)
    rho, inflate = ar1_inflation(resid[win.n0:]) if dependence else (0.0, 1.0)
    dof = max(win.xw.size - int(free.sum()), 1)
    noise_sd = math.sqrt(float(np.sum(resid[win.n0:] ** 2)) / dof) * inflate
    return resid, rho, inflate, dof, noise_sd


def _profile_flags(profile: CeilingProfile, xw: np.ndarray, flags: list[Flag]) -> list[Flag]:
    """``ceiling_not_identified`` from the profile of A (:mod:`scalectl.curve.profile`), unless
    the flag is set already: when its interval reaches a bound of A, or when the latest
    midpoint among the curves it allows leaves the points short of the reach the point
    estimate is held to (>= MIN_POINTS_PAST_MIDPOINT window points past it and the last at
    >= MIN_REACH_PAST_MIDPOINT x it).  Not after ``late_decline``: the sigmoid does not
    describe such a run, its residuals are misfit rather than noise, and a longer run
    identifies nothing.  xw (m,): the window's compute."""
    if any(f.code in ("ceiling_not_identified", "late_decline") for f in flags):
        return []
    lo, hi = profile.interval
    allowed = f"profile likelihood, {profile.level:.0%}: A from {lo:.3f} to {hi:.3f}"
    if not profile.identified:
        side = f"up to A = {hi:.3f}" if profile.open_high else f"down to A = {lo:.3f}"
        return [Flag("ceiling_not_identified",
                     f"the points fit within their noise {side}, a bound of A ({allowed}): the data "
                     "do not identify the ceiling; extend the run", "A")]
    late = profile.c_mid_high
    past = int(np.sum(xw > late))
    reach = float(xw.max()) / late
    if past < MIN_POINTS_PAST_MIDPOINT or reach < MIN_REACH_PAST_MIDPOINT:
        return [Flag("ceiling_not_identified",
                     f"curves within the noise of the points ({allowed}) put the midpoint as late as "
                     f"C_mid = {late:.4g}; the last point is at {reach:.2f} x that and {past} lie past it "
                     f"(need >= {MIN_REACH_PAST_MIDPOINT} x and >= {MIN_POINTS_PAST_MIDPOINT}): the data do "
                     "not identify the ceiling; extend the run", "A")]
    return []


def _intervals(theta: np.ndarray, free: np.ndarray, win: _Window, resid: np.ndarray, w: np.ndarray,
               inflate: float, s: FitSettings, flags: list[Flag], profile: CeilingProfile | None = None):
    """Bootstrap intervals of the free parameters at ``s.level`` (none without bootstrap):
    ({name: (lo, hi)}, draws (bootstrap, 4) by name or None).  The interval of A also covers
    the profile-likelihood interval (``profile``): bootstrap refits start from the fit and can
    stay in its basin.  Appends to ``flags`` the intervals cut by a bound and a C_mid
    interval that reaches past the last point."""
    if not s.bootstrap:
        return {}, None
    intervals: dict[str, tuple[float, float]] = {}
    draws = bootstrap_draws(theta, free, win.logc, win.yf, resid, win.n0, win.lo, win.hi, s.bootstrap, s.seed,
                            s.bootstrap_kind, weights=None if np.all(w == 1) else w,
                            r0_se=s.r0_se, block=s.block, inflate=inflate)
    samples = _to_named(draws)
    point = _to_named(theta)
    q = (1 - s.level) / 2
    for i in np.flatnonzero(free):
        a, b = np.quantile(samples[:, i], [q, 1 - q])
        intervals[PARAM_NAMES[i]] = (float(min(a, point[i])), float(max(b, point[i])))
    if profile is not None and "A" in intervals:
        a, b = intervals["A"]
        intervals["A"] = (min(a, profile.interval[0]), max(b, profile.interval[1]))
    lo, hi = win.lo, win.hi
    for i in np.flatnonzero(free):
        tol = 1e-3 * (hi[i] - lo[i])
        share = float(np.mean((draws[:, i] - lo[i] <= tol) | (hi[i] - draws[:, i] <= tol)))
        if share > 1 - s.level:
            flags.append(Flag("interval_on_bound",
                              f"{share:.0%} of bootstrap refits put {PARAM_NAMES[i]} on a "
                              "bound: its interval is cut by the bound and too narrow",
                              PARAM_NAMES[i]))
    c_hi = intervals["C_mid"][1]
    if c_hi > win.cmax and not any(f.code == "ceiling_not_identified" for f in flags):
        flags.append(Flag("ceiling_not_identified",
                          f"the {s.level:.0%} interval of C_mid reaches {c_hi:.4g}, past the last "
                          f"point ({win.cmax:.4g}): the midpoint, hence the ceiling, is not pinned down"))
    return intervals, samples
