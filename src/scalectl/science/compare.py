"""Verdicts between fitted runs, the tie rule, and the leave-one-out linearisation.

Rules (docs/method.md, section 3; Khatri et al. 2025, section 3 and appendix A.4):

* Ceilings differ when |A_run - A_baseline| >= margin (0.02: three seeds of one
  recipe gave ceilings within +-0.015) *and* the interval of the difference
  lies beyond half the margin (:data:`CLAIM_SHARE`): "higher ceiling" / "lower
  ceiling".  The paper asks only |dA| >= margin; an interval that merely
  excludes 0 lets a true difference of half the margin through whenever its
  estimate lands beyond the margin (about 1 draw in 10 at sd 0.01 to 2.5 x
  C_mid, docs/fitting.md).  Beyond half the margin, a true difference of at
  most half the margin is called higher (or lower) in at most (1 - level) / 2
  of the draws, one-sided, when the intervals hold their level.
* Ceilings tie when |dA| < margin and the whole interval of dA lies inside
  (-margin, margin).  The runs are then compared on speed: the compute each
  needs to reach 80 % of its own rise A - R0, C_80 = C_mid * 4^(1/B) (from
  eq. 1, R(C_q) = R0 + q (A - R0) at C_q = C_mid (q / (1 - q))^(1/B)).  C_80 does
  not depend on A, so a run with a lower ceiling is not made to look flatter.
  Its ratio run / baseline gets a bootstrap interval (the two runs' bootstrap
  draws, independent runs).  "tie on ceiling, faster" when the ratio is at most
  1/1.05 and its interval lies below 1, "... slower" when it is at least 1.05
  and its interval lies above 1, else "tie on ceiling, speed undecided".
* Otherwise (the interval straddles the margin, or a ceiling is not identified)
  the verdict is "undecided".

The interval of dA combines the two runs' A intervals (independent runs) by
adding their half-widths on each side in quadrature.  The shared-A refit
(both runs refitted with their mean A held fixed) is still reported, as a
description, and is what the leave-one-out plot draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from scalectl.curve import Flag, SigmoidFit, fit_sigmoid
from scalectl.defaults import MARGIN

BASELINE = "baseline"
HIGHER = "higher ceiling"
LOWER = "lower ceiling"
FASTER = "tie on ceiling, faster"
SLOWER = "tie on ceiling, slower"
SPEED_UNDECIDED = "tie on ceiling, speed undecided"
UNDECIDED = "undecided"
VERDICTS = (BASELINE, HIGHER, LOWER, FASTER, SLOWER, SPEED_UNDECIDED, UNDECIDED)
#: Speed is compared at the compute that reaches this fraction of a run's own rise A - R0.
SPEED_FRACTION = 0.8
#: A speed ratio closer to 1 than this factor is no difference (as the margin is for A).
SPEED_MARGIN = 1.05
#: Bootstrap draws used when a fit read from the store carries none.
SPEED_BOOTSTRAP = 1000
#: "higher"/"lower ceiling" needs the interval of dA to lie beyond this share of the margin.
CLAIM_SHARE = 0.5


@dataclass(frozen=True)
class RunCurve:
    """One run's evaluation points and its fit, as :func:`compare` needs them.

    compute (n,): compute per point on ``fit.axis``; pass_rate (n,): mean@k.
    ``hardware`` (e.g. "H100") is the hardware class the GPU-hours were spent on.
    """

    compute: np.ndarray
    pass_rate: np.ndarray
    fit: SigmoidFit
    hardware: str | None = None


@dataclass(frozen=True)
class Row:
    """One run in a comparison, against the baseline."""

    name: str
    A: float
    B: float
    C_mid: float
    A_interval: tuple[float, float] | None
    delta_A: float
    delta_A_interval: tuple[float, float]
    verdict: str
    reason: str
    shared_A: float | None = None
    B_shared: float | None = None
    C_mid_shared: float | None = None
    flags: tuple[str, ...] = ()
    speed_ratio: float | None = None
    speed_interval: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "A": self.A, "B": self.B, "C_mid": self.C_mid,
            "A_interval": None if self.A_interval is None else list(self.A_interval),
            "delta_A": self.delta_A, "delta_A_interval": list(self.delta_A_interval),
            "verdict": self.verdict, "reason": self.reason, "shared_A": self.shared_A,
            "B_shared": self.B_shared, "C_mid_shared": self.C_mid_shared, "flags": list(self.flags),
            "speed_ratio": self.speed_ratio,
            "speed_interval": None if self.speed_interval is None else list(self.speed_interval),
        }


@dataclass(frozen=True)
class Comparison:
    """Rows ranked by A (highest first), the baseline's name, margin and warnings."""

    baseline: str
    margin: float
    rows: tuple[Row, ...]
    flags: tuple[Flag, ...] = field(default=())
    #: Overtakings: a run with the lower ceiling that leads at the compute both runs reached,
    #: and where the other's curve crosses it (:func:`overtakings`).
    crossings: tuple[Any, ...] = field(default=())

    def row(self, name: str) -> Row:
        """The row of run ``name``.  Raises KeyError naming the known runs."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no run {name!r} in this comparison (runs: {[r.name for r in self.rows]})")

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "margin": self.margin,
                "rows": [r.to_dict() for r in self.rows],
                "flags": [{"code": f.code, "message": f.message} for f in self.flags],
                "crossings": [c.to_dict() for c in self.crossings]}


def delta_interval(run: SigmoidFit, base: SigmoidFit) -> tuple[float, float]:
    """Interval of A_run - A_base from the two (independent) A intervals.

    Lower side: sqrt((A_r - lo_r)^2 + (hi_b - A_b)^2); upper side symmetric.  A fit
    without an A interval counts as exact (half-width 0).
    """
    d = run.A - base.A
    lr, hr = run.interval("A") or (run.A, run.A)
    lb, hb = base.interval("A") or (base.A, base.A)
    return (d - math.hypot(run.A - lr, hb - base.A), d + math.hypot(hr - run.A, base.A - lb))


def _r0_of(f: SigmoidFit) -> str | float:
    """The r0 argument that refits ``f`` as it was fitted."""
    return "fit" if f.r0_fitted else "measured" if f.r0_measured else f.R0


def refit_fixed_A(curve: RunCurve, A: float, bootstrap: int = 0, seed: int = 0) -> SigmoidFit:
    """Refit a run with its ceiling held at ``A``, same window, R0 and method as its fit."""
    f = curve.fit
    return fit_sigmoid(curve.compute, curve.pass_rate, min_compute=f.window[0],
                       r0=_r0_of(f), method=f.method, axis=f.axis,
                       fixed_A=A, bootstrap=bootstrap, seed=seed, level=f.level)


def compute_to_fraction(C_mid: Any, B: Any, q: float = SPEED_FRACTION) -> np.ndarray:
    """Compute at which a curve has covered the fraction ``q`` of its own rise A - R0.

    From eq. 1: R(C) = R0 + q (A - R0) at C_q = C_mid (q / (1 - q))^(1/B); independent
    of A and R0.  C_mid in compute units (any shape), B > 0, 0 < q < 1.  Raises
    ValueError on q outside (0, 1).
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"fraction q must lie strictly between 0 and 1 (given {q})")
    return np.asarray(C_mid, dtype=float) * (q / (1.0 - q)) ** (1.0 / np.asarray(B, dtype=float))


def bootstrap_draws(curve: RunCurve, n: int = SPEED_BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """The fit's bootstrap draws (n, 4: A, C_mid, B, R0), refitted when the fit carries none
    (a fit read back from the store): same window, R0 and method as the fit."""
    f = curve.fit
    if f.samples is not None and len(f.samples):
        return f.samples
    g = fit_sigmoid(curve.compute, curve.pass_rate, min_compute=f.window[0],
                    r0=_r0_of(f), method=f.method, axis=f.axis,
                    bootstrap=f.n_bootstrap or n, seed=seed, level=f.level)
    return g.samples


def speed_ratio(cur: RunCurve, base: RunCurve, q: float = SPEED_FRACTION, level: float = 0.95
                ) -> tuple[float, tuple[float, float]]:
    """C_q(run) / C_q(baseline) and its ``level`` bootstrap interval (below 1: run faster).

    The two runs' bootstrap draws are independent; draw i of one is paired with
    draw i of the other and the interval is the percentile interval of the
    ratios, widened to contain the point estimate.
    """
    r, b = bootstrap_draws(cur), bootstrap_draws(base)
    n = min(len(r), len(b))
    ratios = compute_to_fraction(r[:n, 1], r[:n, 2], q) / compute_to_fraction(b[:n, 1], b[:n, 2], q)
    point = float(compute_to_fraction(cur.fit.C_mid, cur.fit.B, q)
                  / compute_to_fraction(base.fit.C_mid, base.fit.B, q))
    a = (1 - level) / 2
    lo, hi = np.quantile(ratios, [a, 1 - a])
    return point, (float(min(lo, point)), float(max(hi, point)))


def _unidentified(fit: SigmoidFit) -> bool:
    return bool(fit.ceiling_problems())


def _verdict(name: str, cur: RunCurve, base: RunCurve, base_name: str, margin: float
             ) -> tuple[str, str, dict]:
    run, ref = cur.fit, base.fit
    d = run.A - ref.A
    lo, hi = delta_interval(run, ref)
    iv = f"dA = {d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    for n, f in ((name, run), (base_name, ref)):
        if f.has_flag("late_decline"):
            why = "; ".join(fl.message for fl in f.flags if fl.code == "late_decline")
            return UNDECIDED, f"{n} declines after a peak: {why}", {}
        if _unidentified(f):
            why = "; ".join(fl.message for fl in f.flags
                            if fl.code == "ceiling_not_identified" or fl.param == "A")
            return UNDECIDED, f"ceiling of {n} not identified: {why}", {}
    claim = CLAIM_SHARE * margin
    if d >= margin and lo > claim:
        return HIGHER, f"{iv} >= margin {margin:.3f}, interval above +{claim:.3f}", {}
    if d <= -margin and hi < -claim:
        return LOWER, f"{iv} <= -margin {margin:.3f}, interval below -{claim:.3f}", {}
    if not (-margin < lo and hi < margin):
        beyond = (f": dA is beyond the margin, but its interval reaches within +-{claim:.3f} (half the "
                  "margin)") if abs(d) >= margin else ""
        return UNDECIDED, f"{iv} straddles the margin {margin:.3f}{beyond}", {}
    if run.axis != ref.axis:
        return SPEED_UNDECIDED, (f"{iv} within margin {margin:.3f}; speed not compared: {name} is fitted on "
                                 f"{run.axis}, {base_name} on {ref.axis}"), {}
    ratio, (r_lo, r_hi) = speed_ratio(cur, base, level=ref.level)
    if ratio <= 1 / SPEED_MARGIN and r_hi < 1:
        verdict = FASTER
    elif ratio >= SPEED_MARGIN and r_lo > 1:
        verdict = SLOWER
    else:
        verdict = SPEED_UNDECIDED
    shared = (run.A + ref.A) / 2
    r_fit, b_fit = refit_fixed_A(cur, shared), refit_fixed_A(base, shared)
    pct = f"{SPEED_FRACTION:.0%}"
    reason = (f"{iv} within margin {margin:.3f}; compute to {pct} of the rise: "
              f"x{ratio:.2f} [{r_lo:.2f}, {r_hi:.2f}] of {base_name}'s"
              + ("" if verdict != SPEED_UNDECIDED else
                 f" (not beyond x{1 / SPEED_MARGIN:.2f}..x{SPEED_MARGIN:.2f} with its interval)")
              + f"; with A = {shared:.3f} shared: B {r_fit.B:.2f} vs {b_fit.B:.2f}, "
              f"C_mid {r_fit.C_mid:.4g} vs {b_fit.C_mid:.4g}")
    extra = dict(shared_A=shared, B_shared=r_fit.B, C_mid_shared=r_fit.C_mid,
                 speed_ratio=ratio, speed_interval=(r_lo, r_hi))
    return verdict, reason, extra


def compare(runs: Mapping[str, RunCurve], baseline: str | None = None, margin: float = MARGIN
            ) -> Comparison:
    """Rank runs by A and give each a verdict against ``baseline``.

    runs: name -> :class:`RunCurve` (points and fit; the points are needed for the
    shared-A refit of the tie rule).  baseline: a key of ``runs`` (default: the
    first).  margin: the noise margin on A (paper: 0.02).  Flags runs on
    different hardware classes or compute axes (their compute is not comparable; ceilings
    are, so a run on another axis than the baseline's is judged on A alone, and a tie on A
    is "speed undecided").
    A run whose ceiling is not identified, or whose pass rate falls after a peak
    (``late_decline``: the sigmoid does not describe it, docs/method.md, section 7), is
    undecided against the baseline, and so is every run against such a baseline.
    Raises ValueError on an unknown baseline, an empty mapping or margin <= 0.
    """
    if not runs:
        raise ValueError("compare needs at least one run")
    if margin <= 0:
        raise ValueError(f"margin must be > 0 (given {margin})")
    names = list(runs)
    baseline = names[0] if baseline is None else baseline
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the compared runs: {names}")
    base = runs[baseline]
    flags: list[Flag] = []
    hardware = sorted({c.hardware for c in runs.values() if c.hardware})
    if len(hardware) > 1:
        flags.append(Flag("mixed_hardware", f"runs on different hardware ({', '.join(hardware)}): "
                                            "their GPU-hours are not comparable"))
    axes = sorted({c.fit.axis for c in runs.values()})
    if len(axes) > 1:
        flags.append(Flag("mixed_axis", f"fits on different compute axes ({', '.join(axes)}): ceilings A "
                                        "compare, B and C_mid do not; refit them on one axis to compare speed"))
    rows = []
    for name, cur in runs.items():
        f = cur.fit
        if name == baseline:
            verdict, reason, extra = BASELINE, "", {}
        else:
            verdict, reason, extra = _verdict(name, cur, base, baseline, margin)
        rows.append(Row(
            name=name, A=f.A, B=f.B, C_mid=f.C_mid, A_interval=f.interval("A"),
            delta_A=f.A - base.fit.A, delta_A_interval=delta_interval(f, base.fit),
            verdict=verdict, reason=reason, flags=f.flag_codes, **extra))
    rows.sort(key=lambda r: -r.A)
    return Comparison(baseline=baseline, margin=margin, rows=tuple(rows), flags=tuple(flags),
                      crossings=tuple(overtakings(runs)))


#: How far past the compute both runs reached an overtaking is looked for (a multiple of it).
OVERTAKE_HORIZON = 100.0


def overtakings(runs: Mapping[str, RunCurve], horizon: float = OVERTAKE_HORIZON) -> list:
    """The pairs of runs (same axis, both ceilings identified) in which the run with the lower
    ceiling A leads at the compute both reached (the smaller of their last points), with where
    the other overtakes it within ``horizon`` times that compute: "a choice that only speeds up
    early training can be overtaken later" (Khatri et al. 2025, section 4).  Returns
    :class:`scalectl.science.forecast.Crossing` (the lower-ceiling run first; the interval
    when both fits carry bootstrap draws)."""
    from itertools import combinations

    from scalectl.science.forecast import crossing

    found = []
    for a, b in combinations(runs, 2):
        fa, fb = runs[a].fit, runs[b].fit
        if fa.axis != fb.axis or _unidentified(fa) or _unidentified(fb) or fa.A == fb.A:
            continue
        low, high = (a, b) if fa.A < fb.A else (b, a)
        now = float(min(np.max(runs[a].compute), np.max(runs[b].compute)))
        if not now > 0 or runs[low].fit.predict(now) <= runs[high].fit.predict(now):
            continue
        c = crossing(low, runs[low].fit, high, runs[high].fit, start=now, horizon=horizon * now)
        if c.compute is not None:
            found.append(c)
    return found


# ----------------------------------------------------------------------------- leave-one-out


def linearise(compute: Any, pass_rate: Any, A: float, B: float, C_mid: float, R0: float
              ) -> np.ndarray:
    """log F(R) for the leave-one-out plots (docs/method.md, section 3).

    F(R) = C_mid^B / ((A - R0)/(R - R0) - 1) equals C^B on the curve, so log F
    against log C is a line of slope B.  Computed in logs:
    log F = B log C_mid - log((A - R0)/(R - R0) - 1).  ``compute`` is unused but
    kept so the call reads like the plot it feeds.  Returns an array like
    ``pass_rate``, NaN where R is not strictly between R0 and A.
    """
    R = np.asarray(pass_rate, dtype=float)
    ok = (R - R0) * (A - R) > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = (A - R0) / (R - R0) - 1.0
        out = B * math.log(C_mid) - np.log(inner)
    return np.where(ok, out, np.nan)


@dataclass(frozen=True)
class LooLine:
    """One run's linearised points with its ceiling ``A`` fixed (shared by the lines of
    :func:`loo_lines`, or the run's own): log C (n,), log F (n,), slope B."""

    name: str
    log_c: np.ndarray
    log_f: np.ndarray
    A: float
    B: float
    C_mid: float
    R0: float


def loo_lines(runs: Mapping[str, RunCurve], A: float | None = None, margin: float | None = None) -> list[LooLine]:
    """Refit each run with one shared ceiling ``A`` (default: mean of their A) and linearise.

    With ``margin`` and no ``A``: when the runs' own ceilings differ by more than the margin
    (largest minus smallest A), one shared A would bend each run's slope B away from its own
    (a run whose ceiling is 0.08 below the shared one is fitted as a different curve), so
    each run is linearised with its own A instead (the lines' ``A`` then differ).

    Points in each fit window whose pass rate is not strictly between R0 and A
    are dropped (the transform is undefined there).
    """
    if not runs:
        raise ValueError("loo_lines needs at least one run")
    own = [c.fit.A for c in runs.values()]
    apart = A is None and margin is not None and max(own) - min(own) > margin
    A = float(np.mean(own)) if A is None else float(A)
    out = []
    for name, cur in runs.items():
        f = refit_fixed_A(cur, cur.fit.A if apart else A)
        x = np.asarray(cur.compute, dtype=float)
        y = np.asarray(cur.pass_rate, dtype=float)
        w = (x >= f.window[0]) & (x > 0)
        lf = linearise(x[w], y[w], f.A, f.B, f.C_mid, f.R0)
        ok = np.isfinite(lf)
        out.append(LooLine(name, np.log(x[w][ok]), lf[ok], f.A, f.B, f.C_mid, f.R0))
    return out

