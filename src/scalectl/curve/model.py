"""The ScaleRL sigmoid and the type of a fitted curve.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

(Khatri et al. 2025, "The Art of Scaling RL Compute for LLMs", arXiv 2510.13786,
eq. 1 in section 3).  ``C`` is training compute on the axis the caller chooses
(GPU-hours, FLOPs, tokens, steps); ``R`` is the validation pass rate (mean@k) in
[0, 1].  This module holds the formula, its Jacobian, the fit result
(:class:`SigmoidFit`), its flags and the fitting constants of the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np
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
from scalectl.defaults import TRUNCATION_THRESHOLD  # noqa: E402 - re-exported here


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
    R0: pass rate at compute 0: fixed by the caller, fitted from the curve alone
    (``r0_fitted``), or fitted with the evaluations at compute 0 as observations
    (``r0_measured``; it then has an interval).  ``window`` is the (min, max) compute of the points used,
    ``rmse`` the root mean squared residual on them.  ``noise_sd``: the sd of a new
    evaluation around the curve, sqrt(RSS / dof) inflated for the lag-1
    autocorrelation ``autocorr`` of the residuals (see :mod:`scalectl.curve.fit`);
    ``dof`` = window points - fitted parameters.  ``a_profile``: the profile-likelihood
    interval of A at ``level`` (:mod:`scalectl.curve.profile`; None when A was held fixed),
    which the bootstrap interval of A is widened to cover.  ``intervals`` maps a parameter
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
    r0_measured: bool = False
    noise_sd: float = float("nan")
    dof: int = 0
    autocorr: float = 0.0
    a_profile: tuple[float, float] | None = None
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

    def ceiling_problems(self, *, reach: float | None = None, decline: bool = False,
                         interval_bound: bool = False) -> list[str]:
        """Why this fit's ceiling A is not identified; empty when it is.  The one rule behind
        ``compare``'s verdicts, ``forecast``'s refusals and the planning rule of enough data.

        Always counted: the ``ceiling_not_identified`` flag and A on a bound (``on_bound`` of A),
        each by its flag's message.  With ``decline``, also ``late_decline`` (a run falling after a
        peak is not a sigmoid, docs/method.md section 7).  With ``reach``, also points that do not
        reach ``reach`` x C_mid on the fit's axis (docs/fitting.md, "How far a run must go").  With
        ``interval_bound``, also an interval of A that reaches a bound (``interval_on_bound`` of A).

        Args:
            reach: the multiple of C_mid the last window point must reach, or None for no such rule.
            decline: whether a late decline counts against the ceiling.
            interval_bound: whether A's interval on a bound counts against it (the margin's rule).

        Returns:
            One message per reason, in the order of the fit's flags, then the reach.
        """
        codes = ("ceiling_not_identified", "late_decline") if decline else ("ceiling_not_identified",)
        bounds = ("on_bound", "interval_on_bound") if interval_bound else ("on_bound",)
        out = [f.message for f in self.flags if f.code in codes or (f.code in bounds and f.param == "A")]
        if reach is not None and not self.window[1] >= reach * self.C_mid:
            out.append(f"the last point lies at {self.window[1] / self.C_mid:.2g} x C_mid, short of the "
                       f"{reach:g} x C_mid where a ceiling counts as identified")
        return out

    def interval(self, name: str) -> tuple[float, float] | None:
        """The (lo, hi) interval of ``name`` (A, B, C_mid, R0), or None if not computed."""
        iv = self.intervals.get(name)
        return None if iv is None else (float(iv[0]), float(iv[1]))

    def standard_error(self, name: str = "A") -> float | None:
        """The fit's own standard error on ``name``: its interval's width over twice the normal
        quantile of :attr:`level`, (hi - lo) / (2 z_{(1 + level) / 2}) (1.96 at 95 %); None when
        the interval was not computed.  A bootstrap interval need not be symmetric: this is the
        sd of a normal with an interval of that width."""
        from statistics import NormalDist

        iv = self.interval(name)
        return None if iv is None else (iv[1] - iv[0]) / (2 * NormalDist().inv_cdf(0.5 + self.level / 2))

    def band(self, C: Any, kind: Literal["prediction", "confidence"] = "prediction",
             level: float | None = None, seed: int = 0, drift_sd: float = 0.0
             ) -> tuple[np.ndarray, np.ndarray]:
        """Band of the curve at compute ``C`` from the bootstrap draws.

        ``"confidence"``: where the mean curve lies; ``"prediction"``: where a new
        evaluation point falls: curve draws plus noise ``noise_sd`` x Student-t with
        ``dof`` degrees of freedom (the noise sd is estimated from ``dof`` residuals,
        so its tails are t's, not normal's); fits without ``noise_sd`` add
        resampled residuals instead.
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
            # one noise draw per bootstrap curve, the same at every C: each C's band is the
            # quantile of the same distribution as with a draw per (curve, C), and the
            # band's edges run as smoothly as the curves (no Monte Carlo jitter along C)
            rng = np.random.default_rng(seed)
            shape = (curves.shape[0], 1)
            if math.isfinite(self.noise_sd) and self.dof > 0:
                sd = math.hypot(self.noise_sd, drift_sd)
                curves = curves + sd * rng.standard_t(self.dof, size=shape)
            else:
                res = (self.residuals if self.residuals is not None and len(self.residuals)
                       else np.array([0.0]))
                curves = curves + rng.choice(res, size=shape, replace=True)
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
            "r0_measured": self.r0_measured, "dof": self.dof,
            "noise_sd": self.noise_sd if math.isfinite(self.noise_sd) else None,
            "autocorr": self.autocorr,
            "a_profile": None if self.a_profile is None else [float(v) for v in self.a_profile],
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
            n_bootstrap=int(d.get("n_bootstrap", 0)), r0_measured=bool(d.get("r0_measured", False)),
            noise_sd=float("nan") if d.get("noise_sd") is None else float(d["noise_sd"]), dof=int(d.get("dof", 0)),
            autocorr=float(d.get("autocorr", 0.0)),
            a_profile=None if d.get("a_profile") is None else (float(d["a_profile"][0]), float(d["a_profile"][1])),
        )



def _to_named(theta: np.ndarray) -> np.ndarray:
    """(..., 4) internal (A, log C_mid, B, R0) -> (A, C_mid, B, R0)."""
    out = np.array(theta, dtype=float)
    out[..., _U] = np.exp(out[..., _U])
    return out

