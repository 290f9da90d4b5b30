"""Forecasts from a fitted curve: the pass rate at compute not yet spent, the compute a
target pass rate needs, and where one run's curve crosses another's.

The curve is the ScaleRL sigmoid (Khatri et al. 2025, arXiv 2510.13786, eq. 1)

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B),

fitted with bootstrap draws (:func:`scalectl.curve.fit_sigmoid`).  The paper's use of it is
prediction: fit each candidate to a few thousand GPU-hours, then read off where it ends and
which recipe ends highest, since "a choice that only speeds up early training can be
overtaken later" (section 4; docs/method.md).  Every number here carries the uncertainty of
the fit through its bootstrap draws (parameter draws, shape (n_draws, 4): A, C_mid, B, R0):

* a pass rate at compute C: the prediction band of a new evaluation point there
  (:meth:`scalectl.curve.SigmoidFit.band`), made of three parts reported apart: where the
  curve itself lies (the draws' confidence band), the evaluation noise of one point
  (``noise_sd``), and the drift of a run away from its own curve beyond the fitted points
  (``drift_sd``, :data:`scalectl.science.extrapolate.DRIFT_SD`);
* the compute to reach a pass rate r: eq. 1 solved for C,

      C(r) = C_mid * (f / (1 - f))^(1/B),   f = (r - R0) / (A - R0),

  0 when R0 >= r and unbounded when A <= r, applied to every draw (inverted bootstrap
  curves) for its interval, and the share of draws with A <= r as the probability that the
  ceiling is below the target;
* a crossing of two curves: the first sign change of R_a(C) - R_b(C) on (start, horizon],
  refined by Brent's method on log C; its interval from the paired draws of the two
  (independent) runs, with the share of pairs that cross within the horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Mapping, Sequence

import numpy as np

from scalectl.curve import SigmoidFit
from scalectl.science.extrapolate import DRIFT_SD

#: Points of the log-compute grid on which crossings are searched (then refined).
CROSSING_GRID = 1024


class ForecastError(ValueError):
    """A forecast that cannot be made from this fit or input (the message says why)."""


def unidentified_reasons(fit: SigmoidFit) -> list[str]:
    """Why a fit's ceiling cannot carry a forecast: the messages of its flags
    ``ceiling_not_identified``, ``on_bound`` of A and ``late_decline`` (a run falling after a
    peak is not a sigmoid, docs/method.md section 7).  Empty when it can."""
    return fit.ceiling_problems(decline=True)


def check_compute(values: Sequence[float], *, after: float, what: str = "compute") -> np.ndarray:
    """The compute values (k,) as floats, each finite and beyond ``after`` (the last point).

    Raises:
        ForecastError: a value not finite, <= 0, or not beyond ``after``, naming ``what``.
    """
    c = np.asarray(values, dtype=float).reshape(-1)
    for v in c:
        if not math.isfinite(v) or v <= 0:
            raise ForecastError(f"{what} must be a finite compute > 0 (given {v:.4g})")
        if v <= after:
            raise ForecastError(f"{what} ({v:.4g}) is not beyond the last point at {after:.4g}: a forecast is "
                                "for compute not yet spent (scalectl fit draws the curve over the points)")
    return c


def _draws(fit: SigmoidFit) -> np.ndarray:
    if fit.samples is None or len(fit.samples) == 0:
        raise ForecastError("this fit has no bootstrap draws: fit with bootstrap > 0 to forecast with a band")
    return np.asarray(fit.samples, dtype=float)


# ------------------------------------------------------------------------- pass rate at compute


@dataclass(frozen=True)
class PassRateForecast:
    """The pass rate forecast at one compute value (units of ``fit.axis``).

    ``predicted``: R(compute) of the fit.  ``lo``/``hi``: the prediction band at ``level``
    (where a new evaluation point falls).  Its parts: ``curve_lo``/``curve_hi``, where the curve
    itself lies (the bootstrap draws alone); ``noise_sd``, the sd of one evaluation around the
    curve; ``drift_sd``, the sd of a run's drift from its curve beyond the fitted points.
    ``times_last``: compute / the last point's compute.  ``flags``: the fit's flag codes.
    """

    compute: float
    times_last: float
    predicted: float
    lo: float
    hi: float
    curve_lo: float
    curve_hi: float
    noise_sd: float
    drift_sd: float
    level: float
    flags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"compute": self.compute, "times_last": self.times_last, "pass_rate": self.predicted,
                "band": [self.lo, self.hi], "level": self.level,
                "parts": {"fit": [self.curve_lo, self.curve_hi],
                          "noise_sd": self.noise_sd if math.isfinite(self.noise_sd) else None,
                          "drift_sd": self.drift_sd},
                "flags": list(self.flags)}


def pass_rate_at(fit: SigmoidFit, compute: Sequence[float], *, last: float, drift_sd: float = DRIFT_SD,
                 seed: int = 0) -> list[PassRateForecast]:
    """The pass rate forecast at each compute value (k,) beyond ``last`` (the last point's compute).

    The band is :meth:`SigmoidFit.band` ``"prediction"`` with ``drift_sd`` (the curve draws
    plus Student-t noise of sd sqrt(noise_sd^2 + drift_sd^2)); its fit part the ``"confidence"``
    band of the same draws.

    Raises:
        ForecastError: a compute not finite, <= 0 or not beyond ``last``; a fit without draws;
            ``drift_sd`` < 0.
    """
    if not drift_sd >= 0:
        raise ForecastError(f"drift sd must be >= 0 (given {drift_sd})")
    c = check_compute(compute, after=last)
    _draws(fit)
    lo, hi = fit.band(c, kind="prediction", drift_sd=drift_sd, seed=seed)
    clo, chi = fit.band(c, kind="confidence")
    pred = fit.predict(c)
    return [PassRateForecast(compute=float(c[i]), times_last=float(c[i] / last) if last > 0 else math.inf,
                             predicted=float(pred[i]), lo=float(lo[i]), hi=float(hi[i]),
                             curve_lo=float(clo[i]), curve_hi=float(chi[i]), noise_sd=float(fit.noise_sd),
                             drift_sd=float(drift_sd), level=fit.level, flags=fit.flag_codes)
            for i in range(c.size)]


# ------------------------------------------------------------------------- compute to a target


def compute_to_reach(target: float, A: Any, B: Any, C_mid: Any, R0: Any) -> np.ndarray:
    """Eq. 1 solved for C: the compute at which R(C) first reaches ``target`` (broadcast over
    the parameter arrays): C_mid * (f / (1 - f))^(1/B) with f = (target - R0) / (A - R0);
    0 where R0 >= target, inf where A <= target (never reached).  Units: those of C_mid."""
    A, B, C_mid, R0 = (np.asarray(v, dtype=float) for v in (A, B, C_mid, R0))
    A, B, C_mid, R0 = np.broadcast_arrays(A, B, C_mid, R0)
    out = np.full(A.shape, np.inf)
    start = R0 >= target
    rising = ~start & (A > target)
    f = (target - R0[rising]) / (A[rising] - R0[rising])
    out[rising] = C_mid[rising] * (f / (1.0 - f)) ** (1.0 / B[rising])
    out[start] = 0.0
    return out


@dataclass(frozen=True)
class Reach:
    """The compute to reach pass rate ``target`` (units of the fit's axis).

    ``compute``: from the fit (inf: its ceiling A is at or below the target); ``lo``/``hi``:
    the interval at ``level`` from the inverted bootstrap curves (``hi`` inf when more than
    (1 - level) / 2 of the draws never reach the target).  ``p_ceiling_below``: the share of
    draws whose ceiling is at or below the target.  ``reached``: a measured point is already
    at or above it (the forecast is then of the curve, not of the compute left).
    """

    target: float
    compute: float
    lo: float
    hi: float
    level: float
    p_ceiling_below: float
    A: float
    A_interval: tuple[float, float] | None
    times_last: float
    reached: bool = False
    flags: tuple[str, ...] = ()

    @property
    def reachable(self) -> bool:
        """Whether the fitted curve reaches the target at all (its A is above it)."""
        return math.isfinite(self.compute)

    def to_dict(self) -> dict[str, Any]:
        def num(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {"target": self.target, "reachable": self.reachable, "compute": num(self.compute),
                "interval": [num(self.lo), num(self.hi)], "level": self.level,
                "times_last": num(self.times_last), "p_ceiling_below": self.p_ceiling_below,
                "A": self.A, "A_interval": None if self.A_interval is None else list(self.A_interval),
                "reached": self.reached, "flags": list(self.flags)}


def reach(fit: SigmoidFit, target: float, *, last: float, best_measured: float | None = None) -> Reach:
    """The compute to reach pass rate ``target`` in (0, 1), with its interval from the fit's
    bootstrap draws (:func:`compute_to_reach` on each; order statistics, so unbounded draws
    count as the largest).  ``last``: the last point's compute; ``best_measured``: the highest
    measured pass rate (``reached`` when it is at or above the target).

    Raises:
        ForecastError: target outside (0, 1); a fit without draws.
    """
    if not (math.isfinite(target) and 0.0 < target < 1.0):
        raise ForecastError(f"target pass rate {target:g} must lie strictly between 0 and 1")
    s = _draws(fit)
    point = float(compute_to_reach(target, fit.A, fit.B, fit.C_mid, fit.R0))
    per_draw = compute_to_reach(target, s[:, 0], s[:, 2], s[:, 1], s[:, 3])
    q = (1.0 - fit.level) / 2.0
    lo, hi = np.quantile(per_draw, [q, 1.0 - q], method="inverted_cdf")
    return Reach(target=float(target), compute=point, lo=float(lo), hi=float(hi), level=fit.level,
                 p_ceiling_below=float(np.mean(s[:, 0] <= target)), A=fit.A, A_interval=fit.interval("A"),
                 times_last=point / last if last > 0 else math.inf,
                 reached=best_measured is not None and best_measured >= target, flags=fit.flag_codes)


# ------------------------------------------------------------------------- crossings


@dataclass(frozen=True)
class Crossing:
    """Where the curves of runs ``first`` and ``second`` cross on (``start``, ``horizon``].

    ``compute``: the first crossing of the fitted curves (None: they do not cross there);
    ``lo``/``hi``: the interval at ``level`` of the crossing among the paired bootstrap
    draws that cross, ``probability``: the share of pairs that cross within the horizon.
    ``leader_before``/``leader_after``: the run ahead at ``start`` and just after the first
    crossing (the same run when they do not cross), ``leader_at_horizon`` the run ahead there;
    ``crossings``: how many times the fitted curves cross on the range (two sigmoids with
    different R0 can cross twice).
    """

    first: str
    second: str
    start: float
    horizon: float
    compute: float | None
    lo: float | None
    hi: float | None
    probability: float | None
    leader_before: str
    leader_after: str
    crossings: int
    level: float
    leader_at_horizon: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [self.first, self.second], "start": self.start, "horizon": self.horizon,
                "compute": self.compute, "interval": None if self.lo is None else [self.lo, self.hi],
                "probability": self.probability, "leader_before": self.leader_before,
                "leader_after": self.leader_after, "crossings": self.crossings, "level": self.level,
                "leader_at_horizon": self.leader_at_horizon}


def _sigmoid_rows(params: np.ndarray, logc: np.ndarray) -> np.ndarray:
    """(m, g) curves of m parameter rows (A, C_mid, B, R0) on a log-compute grid (g,)."""
    A, C_mid, B, R0 = (params[:, [i]] for i in range(4))
    return R0 + (A - R0) / (1.0 + np.exp(B * (np.log(C_mid) - logc[None, :])))


def _first_change(d: np.ndarray) -> np.ndarray:
    """Index i of the first sign change between d[:, i] and d[:, i+1] per row (-1: none).
    A zero counts with the sign before it."""
    s = np.sign(d)
    for j in range(1, s.shape[1]):                     # carry the last nonzero sign over exact zeros
        zero = s[:, j] == 0
        s[zero, j] = s[zero, j - 1]
    change = s[:, 1:] * s[:, :-1] < 0
    has = change.any(axis=1)
    return np.where(has, change.argmax(axis=1), -1)


def crossing(name_a: str, fit_a: SigmoidFit, name_b: str, fit_b: SigmoidFit, *, start: float,
             horizon: float) -> Crossing:
    """Where the curves of two fits on one axis cross on (``start``, ``horizon``] (see
    :class:`Crossing`).

    Raises:
        ForecastError: fits on different axes, start <= 0, horizon <= start or not finite.
    """
    from scipy.optimize import brentq

    if fit_a.axis != fit_b.axis:
        raise ForecastError(f"{name_a} is fitted on {fit_a.axis}, {name_b} on {fit_b.axis}: curves on "
                            "different compute axes cannot cross (refit them with one --axis)")
    if not (math.isfinite(start) and start > 0 and math.isfinite(horizon) and horizon > start):
        raise ForecastError(f"the crossing range ({start:g}, {horizon:g}] must have 0 < start < horizon")
    logc = np.linspace(math.log(start), math.log(horizon), CROSSING_GRID)

    def diff(lc: float) -> float:
        c = math.exp(lc)
        return float(fit_a.predict(c) - fit_b.predict(c))

    params = np.array([[f.A, f.C_mid, f.B, f.R0] for f in (fit_a, fit_b)])
    curves = _sigmoid_rows(params, logc)
    d = curves[0] - curves[1]
    s = np.sign(d)
    s = s[s != 0]
    n_cross = int(np.sum(s[1:] * s[:-1] < 0)) if s.size else 0
    i = int(_first_change(d[None, :])[0])
    point = None
    if i >= 0:
        point = math.exp(brentq(diff, logc[i], logc[i + 1], xtol=1e-12)) if d[i] != 0 else math.exp(logc[i])
    ahead = name_a if d[0] >= 0 else name_b
    after = ahead if point is None else (name_b if ahead == name_a else name_a)
    lo = hi = prob = None
    level = min(fit_a.level, fit_b.level)
    if fit_a.samples is not None and len(fit_a.samples) and fit_b.samples is not None and len(fit_b.samples):
        m = min(len(fit_a.samples), len(fit_b.samples))
        dd = _sigmoid_rows(np.asarray(fit_a.samples[:m], float), logc) - \
            _sigmoid_rows(np.asarray(fit_b.samples[:m], float), logc)
        idx = _first_change(dd)
        cross = idx >= 0
        prob = float(np.mean(cross))
        if cross.any():
            rows, j = np.nonzero(cross)[0], idx[cross]
            d0, d1 = dd[rows, j], dd[rows, j + 1]
            t = np.where(d1 != d0, d0 / (d0 - d1), 0.0)     # linear in log C between the grid points
            at = np.exp(logc[j] + t * (logc[j + 1] - logc[j]))
            q = (1.0 - level) / 2.0
            lo, hi = (float(v) for v in np.quantile(at, [q, 1.0 - q]))
    return Crossing(first=name_a, second=name_b, start=float(start), horizon=float(horizon), compute=point,
                    lo=lo, hi=hi, probability=prob, leader_before=ahead, leader_after=after,
                    crossings=n_cross, level=level, leader_at_horizon=name_a if d[-1] >= 0 else name_b)


def crossings(fits: Mapping[str, SigmoidFit], *, start: float, horizon: float) -> list[Crossing]:
    """:func:`crossing` of every pair of ``fits`` (name -> fit, in the given order).

    Raises:
        ForecastError: as :func:`crossing`.
    """
    return [crossing(a, fits[a], b, fits[b], start=start, horizon=horizon) for a, b in combinations(fits, 2)]


def parse_compute(text: str, last: float, what: str) -> float:
    """A compute value from the command line: a number (``3.5e13``) or a multiple of the last
    point's compute (``4x``).

    Raises:
        ForecastError: neither, naming ``what``.
    """
    t = text.strip().lower()
    try:
        if t.endswith("x"):
            return float(t[:-1]) * last
        return float(t)
    except ValueError:
        raise ForecastError(f"{what} {text!r} is neither a compute value (e.g. 3.5e13) nor a multiple of "
                            "the last point's compute (e.g. 4x)") from None
