"""Forecasts from a fitted curve (scalectl.science.forecast): the pass rate at compute not yet
spent, the compute to reach a target, crossings; checked against eq. 1 solved by hand and
against simulated curves of known parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalectl.curve import SigmoidFit, fit_sigmoid, sigmoid
from scalectl.science.forecast import (
    ForecastError,
    check_compute,
    compute_to_reach,
    crossing,
    parse_compute,
    pass_rate_at,
    reach,
    unidentified_reasons,
)

TRUE = dict(A=0.65, B=1.5, C_mid=1000.0, R0=0.3)


def simulated(seed: int, sd: float = 0.01, reach_x: float = 3.0, n: int = 41, **params):
    p = {**TRUE, **params}
    x = np.linspace(0.0, reach_x * p["C_mid"], n)
    rng = np.random.default_rng(seed)
    return x, sigmoid(x, p["A"], p["B"], p["C_mid"], p["R0"]) + rng.normal(0.0, sd, x.size), rng


def known(A, B, C_mid, R0, axis="gpu_hours") -> SigmoidFit:
    """A fit with the given parameters and no draws (for the point estimates)."""
    return SigmoidFit(A=A, B=B, C_mid=C_mid, R0=R0, r0_fitted=True, window=(1.0, 10.0), n_points=10,
                      rmse=0.0, method="vp", axis=axis)


def test_compute_to_reach_inverts_eq_1():
    A, B, C_mid, R0 = 0.62, 1.7, 10_909.0, 0.31
    targets = np.array([0.32, 0.4, 0.5, 0.6, 0.619])
    c = np.array([float(compute_to_reach(t, A, B, C_mid, R0)) for t in targets])
    # R(C(r)) = r: the round trip loses only float rounding (a few ulps of r)
    np.testing.assert_allclose(sigmoid(c, A, B, C_mid, R0), targets, rtol=1e-12)
    # by hand at the midpoint's rise: r = R0 + (A - R0) / 2 is reached at C_mid exactly
    assert float(compute_to_reach(R0 + (A - R0) / 2, A, B, C_mid, R0)) == pytest.approx(C_mid, rel=1e-12)
    # 80 % of the rise: C_mid * 4^(1/B) (docs/method.md, the speed rule)
    assert float(compute_to_reach(R0 + 0.8 * (A - R0), A, B, C_mid, R0)) == pytest.approx(
        C_mid * 4 ** (1 / B), rel=1e-12)
    assert float(compute_to_reach(0.30, A, B, C_mid, R0)) == 0.0          # at or below R0: at the start
    assert math.isinf(float(compute_to_reach(0.62, A, B, C_mid, R0)))    # the ceiling itself: never
    assert math.isinf(float(compute_to_reach(0.7, A, B, C_mid, R0)))
    # over arrays of parameters (one per bootstrap draw)
    got = compute_to_reach(0.5, np.array([0.6, 0.45]), B, np.array([100.0, 200.0]), R0)
    assert got[0] == pytest.approx(100.0 * ((0.19 / 0.29) / (0.10 / 0.29)) ** (1 / B)) and math.isinf(got[1])


def test_pass_rate_at_gives_the_curve_and_a_band_made_of_its_parts():
    x, y, _ = simulated(seed=5)
    fit = fit_sigmoid(x, y, bootstrap=400, seed=0)
    last = x[-1]
    at = [2 * last, 4 * last, 10 * last]
    with_drift = pass_rate_at(fit, at, last=last, drift_sd=0.02)
    without = pass_rate_at(fit, at, last=last, drift_sd=0.0)
    for f, g, c in zip(with_drift, without, at):
        assert f.predicted == pytest.approx(float(sigmoid(c, fit.A, fit.B, fit.C_mid, fit.R0)), rel=1e-12)
        assert f.times_last == pytest.approx(c / last)
        assert f.lo < f.curve_lo <= f.predicted <= f.curve_hi < f.hi
        assert (f.curve_lo, f.curve_hi) == (g.curve_lo, g.curve_hi)      # drift widens only the band
        assert f.hi - f.lo > g.hi - g.lo
        assert f.noise_sd == pytest.approx(fit.noise_sd) and f.drift_sd == 0.02
        d = f.to_dict()
        assert d["parts"]["fit"] == [f.curve_lo, f.curve_hi] and d["band"] == [f.lo, f.hi]
    # the curve part widens as the forecast reaches further past the points
    widths = [f.curve_hi - f.curve_lo for f in without]
    assert widths[0] < widths[2]


@pytest.mark.parametrize("bad, match", [
    ([0.0], "finite compute > 0"), ([-5.0], "finite compute > 0"), ([math.inf], "finite compute > 0"),
    ([math.nan], "finite compute > 0"), ([100.0], "not beyond the last point"),
])
def test_a_forecast_is_only_for_compute_not_yet_spent(bad, match):
    with pytest.raises(ForecastError, match=match):
        check_compute(bad, after=3000.0, what="--at")


def test_parse_compute_reads_values_and_multiples():
    assert parse_compute("3.5e13", 10.0, "--at") == 3.5e13
    assert parse_compute("4x", 2500.0, "--at") == 10_000.0
    assert parse_compute("1.5X", 2.0, "--at") == 3.0
    with pytest.raises(ForecastError, match="--horizon 'far' is neither"):
        parse_compute("far", 2.0, "--horizon")


def test_forecast_bands_cover_simulated_points_at_their_level():
    """On curves of known parameters fitted up to 3 x C_mid with evaluation noise sd 0.01, the 95 %
    band at 2x, 4x and 10x the last fitted compute covers a point drawn there with the same noise,
    and the interval of the compute to reach 0.6 covers the true one, in 95 % of the draws.
    With n draws a share's sd is sqrt(0.95 * 0.05 / n); the test allows 3.5 of them."""
    n = 400
    tol = 3.5 * math.sqrt(0.95 * 0.05 / n)
    mult = np.array([2.0, 4.0, 10.0])
    inside = np.zeros(3)
    reached = 0
    true_c = float(compute_to_reach(0.6, TRUE["A"], TRUE["B"], TRUE["C_mid"], TRUE["R0"]))
    for i in range(n):
        x, y, rng = simulated(seed=1000 + i)
        fit = fit_sigmoid(x, y, bootstrap=300, seed=i)
        fc = pass_rate_at(fit, mult * x[-1], last=x[-1], drift_sd=0.0, seed=i)
        new = sigmoid(mult * x[-1], TRUE["A"], TRUE["B"], TRUE["C_mid"], TRUE["R0"]) + rng.normal(0, 0.01, 3)
        inside += [f.lo <= v <= f.hi for f, v in zip(fc, new)]
        r = reach(fit, 0.6, last=x[-1])
        reached += r.lo <= true_c <= r.hi
    for share in inside / n:
        assert abs(share - 0.95) <= tol, inside / n
    assert abs(reached / n - 0.95) <= tol, reached / n


def test_reach_says_when_the_ceiling_is_below_the_target():
    x, y, _ = simulated(seed=2, reach_x=5.0)
    fit = fit_sigmoid(x, y, bootstrap=500, seed=0)
    low = reach(fit, 0.5, last=x[-1], best_measured=float(y.max()))
    assert low.reachable and low.reached and low.compute < x[-1]
    assert low.lo <= low.compute <= low.hi and low.p_ceiling_below == 0.0
    far = reach(fit, 0.9, last=x[-1])
    assert not far.reachable and far.p_ceiling_below == 1.0 and math.isinf(far.hi)
    near = reach(fit, fit.A - 0.002, last=x[-1])     # inside A's interval: some draws never get there
    assert near.reachable and 0.0 < near.p_ceiling_below < 1.0
    assert near.to_dict()["interval"][1] is None or near.hi > near.compute
    with pytest.raises(ForecastError, match="strictly between 0 and 1"):
        reach(fit, 1.0, last=x[-1])


def test_crossing_of_two_curves_with_one_ceiling_is_where_eq_1_says():
    """With equal A and R0 the curves cross where (C_a / C)^B_a = (C_b / C)^B_b:
    log C = (B_a log C_a - B_b log C_b) / (B_a - B_b)."""
    a = known(0.6, 2.5, 1000.0, 0.3)
    b = known(0.6, 0.8, 600.0, 0.3)
    expect = math.exp((2.5 * math.log(1000.0) - 0.8 * math.log(600.0)) / (2.5 - 0.8))
    c = crossing("steep", a, "shallow", b, start=10.0, horizon=1e5)
    assert c.compute == pytest.approx(expect, rel=1e-9)
    assert (c.leader_before, c.leader_after, c.crossings) == ("shallow", "steep", 1)
    assert c.lo is None and c.probability is None               # no draws: no interval
    none = crossing("steep", a, "shallow", b, start=10.0, horizon=expect * 0.9)
    assert none.compute is None and none.leader_before == none.leader_after == "shallow"
    with pytest.raises(ForecastError, match="different compute axes"):
        crossing("a", a, "b", known(0.6, 1.0, 10.0, 0.3, axis="step"), start=1.0, horizon=10.0)


def test_the_crossing_interval_of_fitted_runs_covers_the_true_crossing():
    """A faster run with the lower ceiling (A 0.60, C_mid 500) and a slower one with the higher
    (A 0.66, C_mid 1500), both fitted to 3,000: the true crossing (found by bisection on the true
    curves, not by the code under test) lies inside the interval, and most pairs of draws cross."""
    fast_true, slow_true = dict(A=0.60, B=1.6, C_mid=500.0), dict(A=0.66, B=1.6, C_mid=1500.0)
    lo, hi = 1.0, 1e6
    f = lambda c: (sigmoid(c, fast_true["A"], 1.6, 500.0, 0.3) - sigmoid(c, slow_true["A"], 1.6, 1500.0, 0.3))
    for _ in range(200):                                          # f > 0 early, < 0 late
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    truth = math.sqrt(lo * hi)
    x = np.linspace(0, 3000.0, 41)
    rng = np.random.default_rng(11)
    fits = {}
    for name, p in (("fast", fast_true), ("slow", slow_true)):
        y = sigmoid(x, p["A"], p["B"], p["C_mid"], 0.3) + rng.normal(0, 0.005, x.size)
        fits[name] = fit_sigmoid(x, y, bootstrap=400, seed=1)
    c = crossing("fast", fits["fast"], "slow", fits["slow"], start=x[1], horizon=30_000.0)
    assert c.compute is not None and c.lo <= truth <= c.hi, (c, truth)
    assert (c.leader_before, c.leader_after) == ("fast", "slow") and c.probability > 0.9


def test_unidentified_reasons_name_the_flags_that_forbid_a_forecast():
    x = np.linspace(0, 300.0, 31)                    # still rising log-linearly: ceiling unknown
    y = 0.3 + 0.1 * np.log1p(x / 30.0) + np.random.default_rng(0).normal(0, 0.003, x.size)
    fit = fit_sigmoid(x, y, bootstrap=100, seed=0)
    assert unidentified_reasons(fit)
    good = fit_sigmoid(*simulated(seed=1, reach_x=5.0)[:2], bootstrap=100, seed=0)
    assert unidentified_reasons(good) == []


def test_one_rule_says_whether_a_ceiling_is_identified_for_compare_forecast_and_planning():
    """SigmoidFit.ceiling_problems is the one rule; compare, forecast and the planning rule of
    enough data each read it with their own options (reach, late decline)."""
    from dataclasses import replace

    from scalectl.curve import Flag
    from scalectl.curve.planning import identifies
    from scalectl.science.compare import _unidentified

    good = fit_sigmoid(*simulated(seed=1, reach_x=5.0)[:2], bootstrap=50, seed=0)
    reached = good.window[1] / good.C_mid
    assert good.ceiling_problems() == [] and not _unidentified(good)
    assert good.ceiling_problems(reach=reached * 0.99) == [] and identifies(good, reach=reached * 0.99)
    short = good.ceiling_problems(reach=reached * 1.01)
    assert len(short) == 1 and f"{reached:.2g} x C_mid" in short[0] and not identifies(good, reach=reached * 1.01)

    other_bound = replace(good, flags=(Flag("on_bound", "B on its bound", "B"),))
    assert other_bound.ceiling_problems() == []                       # only A's bound counts
    on_a = replace(good, flags=(Flag("on_bound", "A on its upper bound 1.0", "A"),))
    assert on_a.ceiling_problems() == ["A on its upper bound 1.0"] and _unidentified(on_a)
    assert unidentified_reasons(on_a) == ["A on its upper bound 1.0"]
    falls = replace(good, flags=(Flag("late_decline", "falls 0.03 after its peak"),))
    assert falls.ceiling_problems() == [] and not _unidentified(falls)          # compare judges it apart
    assert falls.ceiling_problems(decline=True) == unidentified_reasons(falls) == ["falls 0.03 after its peak"]
    interval = replace(good, flags=(Flag("interval_on_bound", "A's interval reaches 1.0", "A"),))
    assert interval.ceiling_problems() == [] and interval.ceiling_problems(interval_bound=True) == [
        "A's interval reaches 1.0"]
