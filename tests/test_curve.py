"""The sigmoid, its fit, intervals and flags (scalectl.curve)."""

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy.optimize import curve_fit

from scalectl.curve import (
    Bounds,
    FitError,
    FitSettings,
    Flag,
    SigmoidFit,
    advise,
    default_min_compute,
    detect_late_decline,
    fit_sigmoid,
    resolve_grid,
    seed_spread,
    sigmoid,
)
from scalectl.defaults import MARGIN
from scalectl.display import format_estimate

# Paper, Table 1: (C_mid GPU-hours, B, A).
TABLE1 = [(2542, 1.92, 0.610), (11272, 1.89, 0.645), (2818, 1.77, 0.605),
          (10909, 1.70, 0.645), (4242, 1.65, 0.710)]
R0 = 0.3


def synthetic(c_mid, b, a, reach, sd, n=60, seed=0):
    """n + 1 evenly spaced evaluations over 0..reach x C_mid, first at compute 0."""
    x = np.linspace(0.0, reach * c_mid, n + 1)
    y = sigmoid(x, a, b, c_mid, R0) + np.random.default_rng(seed).normal(0.0, sd, x.size)
    return x, np.clip(y, 0.0, 1.0)


def test_sigmoid_matches_the_papers_form_and_limits():
    C = np.array([0.0, 1000.0, 2542.0, 5084.0, 1e7])
    got = sigmoid(C, 0.61, 1.92, 2542.0, 0.3)
    with np.errstate(divide="ignore"):
        paper = 0.3 + (0.61 - 0.3) / (1 + (2542.0 / C) ** 1.92)
    np.testing.assert_allclose(got, paper, rtol=1e-12)
    assert got[0] == pytest.approx(0.3)                      # R(0) = R0
    assert got[2] == pytest.approx((0.61 + 0.3) / 2)         # half of A - R0 at C_mid
    assert got[3] == pytest.approx(0.3 + 0.31 / (1 + 0.5**1.92))
    assert got[4] == pytest.approx(0.61, abs=1e-6)           # ceiling
    with pytest.raises(ValueError, match="compute must be >= 0"):
        sigmoid([-1.0], 0.6, 1.0, 10.0, 0.3)


@pytest.mark.parametrize("c_mid,b,a", TABLE1)
def test_default_method_recovers_table1_rows(c_mid, b, a):
    x, y = synthetic(c_mid, b, a, reach=5, sd=0.005, seed=int(c_mid))
    fit = fit_sigmoid(x, y, min_compute=1500)
    assert fit.method == "vp" and not fit.r0_fitted
    assert fit.r0_measured and abs(fit.R0 - R0) < 0.015       # measured at compute 0, sd 0.005
    assert fit.interval("R0")[0] <= fit.R0 <= fit.interval("R0")[1]
    assert abs(fit.A - a) < 0.01
    assert abs(fit.B - b) / b < 0.15
    assert fit.window[0] >= 1500 and fit.n_points == int(np.sum(x >= 1500))
    assert fit.flags == ()
    lo, hi = fit.interval("A")
    assert lo <= fit.A <= hi and hi - lo < 0.03


@pytest.mark.parametrize("c_mid,b,a", TABLE1)
def test_grid_method_finds_table1_ceiling_on_noise_free_data(c_mid, b, a):
    x, y = synthetic(c_mid, b, a, reach=5, sd=0.0)
    fit = fit_sigmoid(x, y, min_compute=1500, method="grid", bootstrap=0)
    assert abs(fit.A - a) <= 0.005 + 1e-9                  # one step of the paper's A grid
    # The paper's grids: A on 0.450..0.800 step 0.005, C_mid on 100 values in [100, 40000].
    a_grid, c_grid = resolve_grid(None, x[x >= 1500], y[x >= 1500], "gpu_hours")
    assert a_grid[0] == 0.45 and a_grid[-1] == 0.8 and len(a_grid) == 71
    np.testing.assert_allclose(c_grid, np.linspace(100, 40000, 100))
    assert np.min(np.abs(a_grid - fit.A)) < 1e-9 and np.min(np.abs(c_grid - fit.C_mid)) < 1e-6
    # B at the chosen pair is scipy curve_fit's least-squares B ...
    w = x >= 1500

    def best_b(A, cm):
        (bb,), _ = curve_fit(lambda C, B: sigmoid(C, A, B, cm, fit.R0), x[w], y[w], p0=[1.0])
        return bb, float(np.sum((sigmoid(x[w], A, bb, cm, fit.R0) - y[w]) ** 2))

    b_cf, ssr_best = best_b(fit.A, fit.C_mid)
    assert fit.B == pytest.approx(b_cf, rel=1e-4)
    # ... and no neighbouring grid pair does better.
    j = int(np.argmin(np.abs(c_grid - fit.C_mid)))
    for da in (-0.005, 0.0, 0.005):
        for dj in (-1, 0, 1):
            if 0 <= j + dj < len(c_grid) and (da, dj) != (0.0, 0):
                assert best_b(fit.A + da, c_grid[j + dj])[1] >= ssr_best * (1 - 1e-6)


def test_interval_covers_true_ceiling_and_never_overstates_certainty():
    """sd 0.01 up to 2.5 x C_mid: 20 seeded draws per Table 1 row (100 fits)."""
    covered, total = 0, 0
    for c_mid, b, a in TABLE1:
        for draw in range(20):
            x, y = synthetic(c_mid, b, a, reach=2.5, sd=0.01, seed=10_000 + draw)
            fit = fit_sigmoid(x, y, min_compute=1500, seed=draw)
            lo, hi = fit.interval("A")
            covered += lo <= a <= hi
            total += 1
            assert lo <= fit.A <= hi
            text = format_estimate(fit.A, (lo, hi))
            decimals = len(text.split()[0].split(".")[1])
            assert 10.0**-decimals <= (hi - lo) / 2              # no digit finer than the interval
    assert covered / total >= 0.85


@pytest.mark.parametrize("c_mid,b,a", TABLE1[:3])
def test_curve_cut_before_midpoint_is_flagged(c_mid, b, a):
    x, y = synthetic(c_mid, b, a, reach=0.6, sd=0.005, n=40, seed=3)
    fit = fit_sigmoid(x, y, min_compute=0.06 * c_mid)
    assert fit.has_flag("ceiling_not_identified")
    lo, hi = fit.interval("A")
    assert hi - lo > 0.1                                      # the interval says so too
    assert advise(fit).action == "extend"


@pytest.mark.parametrize("seed,row", [(34, 4), (54, 4), (56, 1)])
def test_a_spurious_bend_before_the_midpoint_is_flagged_whatever_the_optimiser_returns(seed, row):
    """Imported points (no evaluation at compute 0, R0 fitted) cut at 0.8 x C_mid with noise
    sd 0.01, in draws whose noise bends the curve early: the fit puts C_mid at about half the
    truth, so the points seem to reach past it, and the bootstrap, whose refits start from the
    fit, agrees with itself.  Before the profile check these three came out unflagged with
    A 0.511 [0.472, 0.574], 0.495 [0.463, 0.630] and 0.457 [0.433, 0.497] against true
    ceilings of 0.71, 0.71 and 0.645.  The profile of A finds curves within the noise whose
    midpoint lies at or past the last point: flagged, and the advice is to extend."""
    c_mid, b, a = TABLE1[row]
    x = np.linspace(0.0, 0.8 * c_mid, 41)
    y = np.clip(sigmoid(x, a, b, c_mid, R0) + np.random.default_rng(seed).normal(0.0, 0.01, x.size), 0, 1)
    x, y = x[1:], y[1:]
    fit = fit_sigmoid(x, y, min_compute=default_min_compute(x), bootstrap=200, seed=0)
    assert fit.C_mid < 0.6 * c_mid                                  # the spurious bend
    assert fit.window[1] / fit.C_mid >= 1.3                         # reach measured on the estimate
    flag = next(f for f in fit.flags if f.code == "ceiling_not_identified")
    assert "profile likelihood" in flag.message and flag.param == "A"
    assert advise(fit).action == "extend"
    lo, hi = fit.a_profile
    assert fit.interval("A")[0] <= lo <= fit.A <= hi <= fit.interval("A")[1]


@pytest.mark.parametrize("c_mid,b,a", TABLE1)
def test_the_same_noise_cut_at_0_6_x_c_mid_is_flagged_and_at_5_x_is_not(c_mid, b, a):
    """One noise draw (sd 0.01, seed 7) on each Table 1 curve, 61 points from compute 0.
    Cut at 0.6 x C_mid, curves within the noise reach A = 1: the profile interval is open
    above, the fit is flagged and its interval of A runs to 1 (the estimates are 0.43-0.54,
    far below the truth).  To 5 x C_mid: no flag, a closed profile interval narrower than 0.04,
    and the interval of A within the margin of the true A."""
    for reach in (0.6, 5.0):
        x = np.linspace(0.0, reach * c_mid, 61)
        y = np.clip(sigmoid(x, a, b, c_mid, R0) + np.random.default_rng(7).normal(0.0, 0.01, x.size), 0, 1)
        fit = fit_sigmoid(x, y, min_compute=default_min_compute(x), bootstrap=200, seed=0)
        lo, hi = fit.a_profile
        if reach < 1:
            assert fit.has_flag("ceiling_not_identified") and hi == 1.0 and fit.interval("A")[1] == 1.0
            assert fit.A < a - 0.1
        else:
            assert not fit.flags and hi < 1.0 and hi - lo < 0.04
            i_lo, i_hi = fit.interval("A")
            assert i_lo - MARGIN < a < i_hi + MARGIN


def test_profile_interval_ends_where_a_refit_with_A_held_rises_by_the_F_cutoff():
    """The ends of the profile interval of A, checked with scipy's least squares: refit
    (C_mid, B, R0) with A held at each end (several starts, the best kept) and compare the
    rise of the residual sum of squares over the best fit with sigma^2 F(1, dof; 0.95),
    sigma the fit's noise sd.  A step of 0.005 inside an end stays below the cutoff, a step
    outside goes above it: the ends are right to better than 0.005 (the grid step is 0.02,
    the ends interpolated on the signed root of the rise)."""
    from scipy.optimize import least_squares
    from scipy.stats import f as f_dist

    c_mid, b, a = TABLE1[0]
    x, y = synthetic(c_mid, b, a, reach=2.5, sd=0.01, seed=11)
    fit = fit_sigmoid(x, y, min_compute=1500, bootstrap=0)
    w = x >= 1500
    xs, ys = np.concatenate([[0.0], x[w]]), np.concatenate([y[:1], y[w]])   # R0 observed at 0

    def rss(A):
        def resid(p):
            return sigmoid(xs, A, p[1], math.exp(p[0]), p[2]) - ys
        best = math.inf
        for u0 in np.log(c_mid) + np.array([-1.0, 0.0, 1.0]):
            for b0 in (1.0, 2.0, 4.0):
                r = least_squares(resid, [u0, b0, 0.3], bounds=([np.log(x.max() * 1e-4), 0.05, 0.0],
                                                                [np.log(x.max() * 1e2), 20.0, 1.0]))
                best = min(best, float(np.sum(r.fun ** 2)))
        return best

    rss_min = float(np.sum((sigmoid(xs, fit.A, fit.B, fit.C_mid, fit.R0) - ys) ** 2))
    assert rss(fit.A) == pytest.approx(rss_min, rel=1e-6)
    cutoff = fit.noise_sd ** 2 * f_dist.ppf(0.95, 1, fit.dof)
    lo, hi = fit.a_profile
    assert 0.55 < lo < a < hi < 0.70
    for end, inward in ((lo, +0.005), (hi, -0.005)):
        assert rss(end + inward) - rss_min < cutoff < rss(end - inward) - rss_min
        assert (rss(end) - rss_min) / cutoff == pytest.approx(1.0, abs=0.1)


def test_the_profile_thins_a_long_run_and_keeps_its_sums():
    """Window points beyond 2,000 are thinned to every k-th for the profile, each weighing k:
    the weights still sum to the window's points, and a 20,000-point run gets the profile
    interval of its 2,000 thinned points (their rise of RSS scaled by k = 10)."""
    from scalectl.curve.profile import MAX_PROFILE_POINTS, _thin

    assert MAX_PROFILE_POINTS == 2000
    logc, y, w = np.arange(20_003.0), np.zeros(20_003), np.ones(20_003)
    lt, _, wt = _thin(logc, y, w, n0=3)
    assert lt.size == 3 + 2000 and np.all(lt[:3] == [0, 1, 2]) and lt[4] - lt[3] == 10
    assert wt[:3].tolist() == [1, 1, 1] and wt[3:].sum() == pytest.approx(20_000)
    x = np.linspace(0.0, 5 * 2542.0, 20_001)
    y = np.clip(sigmoid(x, 0.61, 1.92, 2542.0, R0) + np.random.default_rng(2).normal(0, 0.01, x.size), 0, 1)
    fit = fit_sigmoid(x, y, min_compute=1500, bootstrap=0)
    lo, hi = fit.a_profile
    assert lo < fit.A < hi and hi - lo < 0.01 and not fit.flags     # 20,000 points: A within +-0.005


def test_late_decline_is_flagged_and_a_clean_curve_is_not():
    x, y = synthetic(2542, 1.92, 0.61, reach=6, sd=0.005, seed=4)
    assert detect_late_decline(x[1:], y[1:]) is None
    collapsed = np.where(x > 4 * 2542, y - 0.15 * (x - 4 * 2542) / (2 * 2542), y)
    fit = fit_sigmoid(x, collapsed, min_compute=1500, bootstrap=0)
    assert fit.flag_codes == ("late_decline",)
    assert not fit_sigmoid(x, y, min_compute=1500, bootstrap=0).has_flag("late_decline")


def test_truncation_flag_uses_the_threshold():
    x, y = synthetic(2542, 1.92, 0.61, reach=5, sd=0.0)
    trunc = np.linspace(0.0, 0.12, x.size)
    fit = fit_sigmoid(x, y, min_compute=1500, bootstrap=0, truncation=trunc)
    assert fit.flag_codes == ("truncation",) and "0.120" in fit.flags[0].message
    ok = fit_sigmoid(x, y, min_compute=1500, bootstrap=0, truncation=trunc,
                     truncation_threshold=0.15)
    assert ok.flags == ()


def test_estimate_on_a_bound_is_flagged_not_clipped_silently():
    x, y = synthetic(2542, 1.92, 0.61, reach=5, sd=0.0)
    fit = fit_sigmoid(x, y, min_compute=1500, bootstrap=0, bounds=Bounds(A=(0.0, 0.58)))
    assert fit.A == pytest.approx(0.58)
    assert fit.has_flag("on_bound")
    assert "A = 0.580 lies on the upper bound" in fit.flags[0].message
    assert fit.flags[0].param == "A"


def test_r0_measured_fitted_or_given():
    x, y = synthetic(4242, 1.65, 0.71, reach=5, sd=0.0)
    x2, y2 = np.append(x, 0.0), np.append(y, 0.32)
    both = fit_sigmoid(x2, y2, bootstrap=0)                  # two observations of R0
    assert 0.3 <= both.R0 <= (0.3 + 0.32) / 2 and both.r0_measured and not both.r0_fitted
    fitted = fit_sigmoid(x[1:], y[1:], bootstrap=0)          # no point at compute 0
    assert fitted.r0_fitted and fitted.R0 == pytest.approx(0.3, abs=1e-4)
    assert fitted.A == pytest.approx(0.71, abs=1e-5)
    assert fit_sigmoid(x, y, r0=0.25, bootstrap=0).R0 == 0.25
    with pytest.raises(FitError, match="needs an evaluation at compute 0"):
        fit_sigmoid(x[1:], y[1:], r0="measured")


@pytest.mark.parametrize("c_mid,b,a", TABLE1[:2])
def test_a_step_0_evaluation_off_by_2_standard_errors_leaves_A_inside_its_interval(c_mid, b, a):
    """Noise-free curve to 2.5 x C_mid, window from 1500, the step-0 point at 0.28 instead
    of 0.30.  Held fixed, R0 = 0.28 moved A by up to +0.027 with an interval excluding the
    truth; with the step-0 evaluation's standard error (0.01) it is one observation among
    the points and A stays within the interval."""
    x = np.linspace(0.0, 2.5 * c_mid, 61)
    y = sigmoid(x, a, b, c_mid, R0)
    y[0] = R0 - 0.02
    held = fit_sigmoid(x, y, min_compute=1500, r0=R0 - 0.02)
    assert not held.interval("A")[0] <= a <= held.interval("A")[1]
    fit = fit_sigmoid(x, y, min_compute=1500, r0_se=0.01)
    # Noise-free points: the curve fits them exactly, the R0 observation's weight
    # (window noise / 0.01)^2 falls to its floor and A and R0 come back exact; the
    # intervals are then ~0 wide, and the refits stop at a relative change of 1e-10
    # in the sum of squares, which leaves A and R0 within ~1e-6 of the optimum.
    lo, hi = fit.interval("A")
    assert lo - 1e-6 <= a <= hi + 1e-6 and abs(fit.A - a) < 1e-4
    r_lo, r_hi = fit.interval("R0")
    assert 0.0 <= r_lo <= fit.R0 <= r_hi <= 1.0 and abs(fit.R0 - R0) < 1e-4


def test_r0_interval_stays_inside_0_and_1():
    x = np.linspace(0.0, 5 * 2542.0, 61)
    y = np.clip(sigmoid(x, 0.5, 1.9, 2542.0, 0.002) + np.random.default_rng(3).normal(0, 0.01, x.size),
                0, 1)
    y[0] = 0.0
    fit = fit_sigmoid(x, y, min_compute=100, r0_se=0.02)
    lo, hi = fit.interval("R0")
    assert 0.0 <= lo <= fit.R0 <= hi <= 1.0


def test_fit_is_invariant_to_the_unit_of_compute():
    x, y = synthetic(10909, 1.70, 0.645, reach=4, sd=0.005, seed=9)
    hours = fit_sigmoid(x, y, min_compute=1500, bootstrap=0)
    flops = fit_sigmoid(x * 3.6e18, y, min_compute=1500 * 3.6e18, bootstrap=0, axis="flops")
    assert flops.A == pytest.approx(hours.A, abs=1e-6)
    assert flops.C_mid / 3.6e18 == pytest.approx(hours.C_mid, rel=1e-5)
    assert flops.axis == "flops"


def test_bootstrap_is_deterministic_given_seed():
    x, y = synthetic(2818, 1.77, 0.605, reach=3, sd=0.01, seed=5)
    a = fit_sigmoid(x, y, min_compute=1500, seed=7)
    b = fit_sigmoid(x, y, min_compute=1500, seed=7)
    c = fit_sigmoid(x, y, min_compute=1500, seed=8)
    assert a.intervals == b.intervals and a.intervals != c.intervals
    pairs = fit_sigmoid(x, y, min_compute=1500, seed=7, bootstrap_kind="pairs")
    assert pairs.interval("A")[0] <= pairs.A <= pairs.interval("A")[1]


def test_warm_started_refits_reach_scipys_optimum():
    """The vectorised refits of the bootstrap land where least_squares does."""
    from scalectl.curve import solvers as curve

    x, y1 = synthetic(2542, 1.92, 0.61, reach=4, sd=0.01, seed=1)
    _, y2 = synthetic(2542, 1.92, 0.61, reach=4, sd=0.01, seed=2)
    f1 = fit_sigmoid(x, y1, min_compute=1500, bootstrap=0)
    f2 = fit_sigmoid(x, y2, min_compute=1500, bootstrap=0)
    w = x >= 1500
    theta = np.array([[f1.A, math.log(f1.C_mid), f1.B, f1.R0]])
    lo = np.array([0.0, math.log(x.max() * 1e-4), 0.05, -1.0])
    hi = np.array([1.0, math.log(x.max() * 1e2), 20.0, 2.0])
    theta[0, 3] = f2.R0
    out, _ = curve._lm(theta, np.array([True, True, True, False]), np.log(x[w]), y2[w], lo, hi)
    assert out[0, 0] == pytest.approx(f2.A, abs=1e-6)
    assert math.exp(out[0, 1]) == pytest.approx(f2.C_mid, rel=1e-5)
    assert out[0, 2] == pytest.approx(f2.B, rel=1e-5)


def test_prediction_band_is_wider_than_confidence_band():
    x, y = synthetic(2542, 1.92, 0.61, reach=5, sd=0.01, seed=6)
    fit = fit_sigmoid(x, y, min_compute=1500)
    c_lo, c_hi = fit.band(x[1:], kind="confidence")
    p_lo, p_hi = fit.band(x[1:], kind="prediction")
    assert np.all(p_hi - p_lo > c_hi - c_lo)
    inside = np.mean((y[1:] >= p_lo) & (y[1:] <= p_hi))
    assert inside > 0.85
    with pytest.raises(ValueError, match="no bootstrap draws"):
        fit_sigmoid(x, y, bootstrap=0).band(x)


def test_to_dict_round_trip_through_json():
    x, y = synthetic(2542, 1.92, 0.61, reach=1.0, sd=0.005, seed=2)
    fit = fit_sigmoid(x, y, min_compute=500, bootstrap=200)
    back = SigmoidFit.from_dict(json.loads(json.dumps(fit.to_dict())))
    assert back == fit
    assert back.flags == fit.flags and len(back.flags) > 0
    np.testing.assert_allclose(back.predict([3000.0]), fit.predict([3000.0]))


def test_bad_input_gives_clear_errors():
    with pytest.raises(FitError, match="compute has 3 values but pass_rate has 2"):
        fit_sigmoid([0, 1, 2], [0.1, 0.2])
    with pytest.raises(FitError, match=r"pass_rate must lie in \[0, 1\]"):
        fit_sigmoid([0, 1, 2, 3, 4], [0.1, 0.2, 1.3, 0.4, 0.5])
    with pytest.raises(FitError, match="compute must be >= 0"):
        fit_sigmoid([-1, 1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5])
    with pytest.raises(FitError, match="not one of: vp, grid"):
        fit_sigmoid([0, 1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5], method="lbfgs")
    with pytest.raises(FitError, match="holds 2 points; at least 4 are needed"):
        fit_sigmoid([0, 1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5], min_compute=3)
    x, y = synthetic(2542, 1.92, 0.61, reach=5, sd=0.0, n=5)
    assert fit_sigmoid(x, y, bootstrap=0).has_flag("too_few_points")


def test_fit_settings_are_the_keywords_of_the_fit():
    """fit_sigmoid's keywords are the fields of FitSettings: a settings object gives the same fit
    (every field, every bootstrap draw), keywords given with it override its fields, a bad
    setting is refused when the object is made, an unknown keyword is a TypeError."""
    x, y = synthetic(2818, 1.77, 0.605, reach=4, sd=0.01, seed=3)
    by_keywords = fit_sigmoid(x, y, min_compute=1500, bootstrap=50, seed=3, level=0.9)
    settings = FitSettings(min_compute=1500, bootstrap=50, seed=3, level=0.9)
    by_settings = fit_sigmoid(x, y, settings=settings)
    overridden = fit_sigmoid(x, y, settings=dataclasses.replace(settings, seed=0, level=0.5), seed=3, level=0.9)
    assert by_settings.to_dict() == by_keywords.to_dict() == overridden.to_dict()
    np.testing.assert_array_equal(by_settings.samples, by_keywords.samples)
    assert by_keywords.level == 0.9 and by_keywords.n_bootstrap == 50
    other_seed = fit_sigmoid(x, y, settings=settings, seed=4)
    assert other_seed.intervals != by_keywords.intervals and other_seed.A == by_keywords.A
    with pytest.raises(FitError, match="interval level must lie strictly between 0 and 1"):
        FitSettings(level=1.0)
    with pytest.raises(FitError, match=r"r0 'x' is not one of: auto, measured, fit, or a number in \[0, 1\]"):
        FitSettings(r0="x")
    with pytest.raises(TypeError, match="min_compte"):
        fit_sigmoid(x, y, min_compte=1500)


def test_default_min_compute():
    assert default_min_compute([0, 5_000, 50_000]) == 1500.0
    assert default_min_compute([0, 100, 200], axis="step") == pytest.approx(3.0)


def _fit(A, B=1.9, C_mid=2500.0, lo=None, hi=None, reach=5.0):
    iv = {} if lo is None else {"A": (lo, hi)}
    return SigmoidFit(A=A, B=B, C_mid=C_mid, R0=0.3, r0_fitted=False,
                      window=(1500.0, reach * C_mid), n_points=50, rmse=0.01, method="vp",
                      intervals=iv)


def test_seed_spread_over_repeated_runs():
    spread = seed_spread([_fit(0.600, B=1.8), _fit(0.615, B=2.0), _fit(0.612, B=1.9)])
    a = spread["A"]
    assert a.n == 3 and a.mean == pytest.approx(0.609)
    assert a.sd == pytest.approx(math.sqrt(((0.009**2) + (0.006**2) + (0.003**2)) / 2))
    assert (a.min, a.max) == (0.600, 0.615)
    lo, hi = a.interval(0.95)
    assert hi - a.mean == pytest.approx(4.302653 * a.sd / math.sqrt(3), rel=1e-5)
    assert spread["B"].mean == pytest.approx(1.9)


def test_advice_extend_versus_seeds():
    assert advise(_fit(0.61, lo=0.60, hi=0.615)).action == "none"              # data to 5 x C_mid
    short = advise(_fit(0.61, lo=0.55, hi=0.68, reach=1.3))
    # the one rule of enough data: IDENTIFY_REACH = 5 x C_mid = 12,500 GPU-hours
    assert short.action == "extend" and "extend the run to about 5 x C_mid (12500 GPU-hours)" in short.message
    assert "the data stop at 1.30 x C_mid, short of 5 x C_mid, where a ceiling counts as identified" in short.message
    # an interval within the margin on data short of the rule is no identified ceiling either
    narrow = advise(_fit(0.61, lo=0.605, hi=0.615, reach=3.0))
    assert narrow.action == "extend" and narrow.message.startswith(
        "A interval width 0.010 is within the margin 0.020, but the data stop at 3.00 x C_mid")
    assert advise(_fit(0.61, lo=0.605, hi=0.615, reach=4.99)).action == "extend"
    # far past C_mid, A on its bound: extend to twice the reach, not "to 5 x C_mid"
    bound = _fit(1.0, lo=0.95, hi=1.0, reach=5.5)
    bound = dataclasses.replace(bound, flags=(Flag("on_bound", "A = 1.000 lies on the upper bound edge", "A"),))
    pinned = advise(bound)
    assert pinned.action == "extend" and "A lies on a bound although the data reach 5.50 x C_mid" in pinned.message
    assert "about 11 x C_mid (27500 GPU-hours)" in pinned.message
    noisy = advise(_fit(0.61, lo=0.585, hi=0.635, reach=5.0), n_seeds=1)
    assert noisy.action == "seeds" and noisy.seeds_needed == math.ceil((0.05 / 0.02) ** 2)
    assert noisy.message.startswith("A interval width 0.050 exceeds the margin 0.020 although")
    # just past the margin: a fourth decimal, so the message does not read "0.020 exceeds 0.020"
    # (0.5854 - 0.565 = 0.0204, up to float rounding far below the fourth decimal)
    barely = advise(_fit(0.572, lo=0.565, hi=0.5854, reach=5.09))
    assert barely.action == "seeds" and barely.seeds_needed == 2
    assert barely.message.startswith("A interval width 0.0204 exceeds the margin 0.0200 although the data reach 5.09")
    with pytest.raises(ValueError, match="no interval for A"):
        advise(_fit(0.61))


def _script(name: str):
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("r0", ["measured", "fit"])
def test_no_unflagged_fit_of_a_cut_curve_misses_its_ceiling_by_the_margin(r0):
    """scripts/ceiling_identification.py on 40 draws per row (the tables of docs/fitting.md
    have 200): curves cut at 0.5-1.2 x C_mid are all flagged, none of the unflagged fits at
    2.5 x C_mid misses the true A by more than the margin, and the 95 % interval of A covers
    the truth in at least 85 % of the draws of each row (a binomial 95 % at n = 40 falls below
    that with probability 0.02)."""
    study = _script("ceiling_identification").study
    for sd in (0.005, 0.01):
        for cut in (0.5, 0.8, 1.2, 2.5):
            r = study(cut, sd, 40, 60_000, 1000, 0.02, r0)
            if cut <= 1.2:
                assert r["flagged"] == 40, (cut, sd, r)
            assert r["unflagged_missed"] == 0, (cut, sd, r)
            assert r["covered"] >= 34, (cut, sd, r)


def test_advice_in_steps_device_hours_and_wall_clock_at_the_runs_measured_rate():
    """The run's points give 25 GPU-hours and 90 s per step (130 steps to 3,250 GPU-hours); the
    extension to 5 x C_mid = 12,500 GPU-hours (the rule of enough data) is (12500 - 3250) / 25 = 370
    more steps, 370 x 25 = 9,250 device-hours, 370 x 90 s = 9.25 h; a noisy fit's extra seeds are
    runs of the same 130 steps each (6 x 130 x 90 s = 19.5 h)."""
    from scalectl.curve import step_rate

    points = [{"step": s, "gpu_hours": 25.0 * s, "wall_seconds": 90.0 * s, "pass_rate": 0.4}
              for s in range(0, 131, 10)]
    rate = step_rate(points, "gpu_hours", source="run-s0")
    assert (rate.compute_per_step, rate.hours_per_step, rate.seconds_per_step) == (25.0, 25.0, 90.0)
    assert (rate.last_step, rate.last_compute) == (130, 3250.0)
    short = advise(_fit(0.61, lo=0.55, hi=0.68, reach=1.3), rate=rate)
    assert short.action == "extend" and (short.steps, short.device_hours, short.seconds) == (370, 9250.0, 33300.0)
    assert ("extend the run to about 5 x C_mid (12500 GPU-hours): about 370 more steps (to step 500; "
            "9250 device-hours, about 9.2 h at run-s0's measured rate)") in short.message
    noisy = advise(_fit(0.61, lo=0.585, hi=0.635, reach=5.0), rate=rate)
    assert noisy.action == "seeds" and noisy.seeds_needed == 7 and noisy.steps == 130
    assert noisy.device_hours == 6 * 130 * 25.0
    assert "6 more run(s) of 130 steps, 19500 device-hours, about 20 h in all" in noisy.message
    # a run on another axis (FLOPs) says nothing in steps about a fit on GPU-hours
    flops = step_rate([{"step": 0, "flops": 0.0}, {"step": 10, "flops": 1e12}], "flops")
    assert advise(_fit(0.61, lo=0.55, hi=0.68, reach=1.3), rate=flops).steps is None
    assert step_rate([{"step": 0, "flops": 0.0}], "flops") is None
