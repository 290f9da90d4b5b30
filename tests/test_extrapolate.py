"""Prefix fits scored on held-out points, and window sensitivity (scalectl.science.extrapolate)."""

import numpy as np
import pytest

from scalectl.curve import sigmoid
from scalectl.science.extrapolate import cut_point, default_windows, extrapolate, window_sensitivity


def paper_run(sd=0.0, seed=0, n=100):
    """ScaleRL 8B batch 2048 (Table 1: C_mid 10909, B 1.70, A 0.645) to 100k GPU-hours."""
    x = np.linspace(0.0, 100_000.0, n + 1)
    y = sigmoid(x, 0.645, 1.70, 10909.0, 0.3) + np.random.default_rng(seed).normal(0, sd, x.size)
    return x, y


def test_first_half_predicts_the_second_half_of_a_noise_free_run():
    x, y = paper_run()
    ex = extrapolate(x, y, fraction=0.5, min_compute=1500, bootstrap=200)
    assert ex.cut == 50_000.0
    assert ex.fit.window[1] == 50_000.0
    np.testing.assert_array_equal(ex.heldout_compute, x[x > 50_000])
    assert ex.max_abs_error < 0.01 and ex.mean_abs_error <= ex.max_abs_error
    assert ex.fit.A == pytest.approx(0.645, abs=1e-3)
    np.testing.assert_allclose(ex.predicted, sigmoid(ex.heldout_compute, ex.fit.A, ex.fit.B,
                                                     ex.fit.C_mid, ex.fit.R0))


def test_short_prefix_of_a_noisy_run_lands_in_its_band():
    x, y = paper_run(sd=0.005, seed=3)
    ex = extrapolate(x, y, until=30_000, min_compute=1500, seed=1)
    assert ex.cut == 30_000 and len(ex.heldout_compute) == 70
    assert ex.mean_abs_error < 0.01
    assert ex.share_in_band is not None and ex.share_in_band >= 0.8
    assert np.all(ex.band_lo < ex.predicted) and np.all(ex.predicted < ex.band_hi)
    d = ex.to_dict()
    assert len(d["heldout"]) == 70 and d["fit"]["A"] == ex.fit.A


def test_without_bootstrap_there_is_no_band():
    x, y = paper_run()
    ex = extrapolate(x, y, fraction=0.5, min_compute=1500, bootstrap=0)
    assert ex.share_in_band is None and ex.band_lo.size == 0


def test_cut_arguments():
    assert cut_point([0, 10, 40], fraction=0.25) == 10.0
    assert cut_point([0, 10, 40], until=7) == 7.0
    with pytest.raises(ValueError, match="exactly one of until"):
        cut_point([0, 10], until=3, fraction=0.5)
    with pytest.raises(ValueError, match="fraction must lie strictly between 0 and 1"):
        cut_point([0, 10], fraction=1.0)
    x, y = paper_run()
    with pytest.raises(ValueError, match="no evaluation point lies past the cut"):
        extrapolate(x, y, until=200_000)


def test_default_windows_follow_the_papers_table():
    assert default_windows([0, 100_000], 1500) == [(1500, 100_000), (0, 100_000),
                                                   (5000, 100_000), (1500, 50_000)]


def test_window_sensitivity_on_clean_and_noisy_runs():
    x, y = paper_run()
    clean = window_sensitivity(x, y, min_compute=1500, bootstrap=0)
    assert len(clean.rows) == 4 and all(r.fit is not None for r in clean.rows)
    assert clean.A_spread < 1e-3                       # noise-free: every window finds A
    x, y = paper_run(sd=0.01, seed=7)
    noisy = window_sensitivity(x, y, [(1500, 100_000), (1500, 20_000), (90_000, 100_000),
                                      (99_500, 100_000)], bootstrap=0)
    assert noisy.rows[2].fit.has_flag("rise_not_identified")     # plateau only
    assert noisy.rows[3].fit is None and "holds 1 point;" in noisy.rows[3].error
    a_full, a_short = noisy.rows[0].fit.A, noisy.rows[1].fit.A
    assert noisy.A_spread == pytest.approx(abs(a_full - a_short))
    assert noisy.to_dict()["rows"][3]["error"]


def test_default_windows_holding_the_same_points_give_one_row():
    """A short run's first point past 0.05 M: (0.05 M, M) holds what (0, M) holds, and the
    table shows that fit once (it showed two identical rows)."""
    x = np.concatenate([[0.0], np.linspace(10.0, 100.0, 10)])       # 0.05 M = 5 < 10
    y = sigmoid(x, 0.8, 1.5, 30.0, 0.3)
    assert default_windows(x, 0.0) == [(0.0, 100.0), (5.0, 100.0), (0.0, 50.0)]
    rows = window_sensitivity(x, y, bootstrap=0).rows
    assert [r.window for r in rows] == [(0.0, 100.0), (0.0, 50.0)]
    assert [r.fit.n_points for r in rows] == [10, 5]
