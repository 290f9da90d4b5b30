"""The fit's memory grows linearly in the points: its grids and bootstrap refits run in
blocks of at most GRID_BLOCK_ELEMENTS elements per array, and a stored run with more points
than a fit needs is fitted on equal-count bins of consecutive points."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from scalectl.curve import fit_sigmoid, sigmoid, solvers
from scalectl.curve.bootstrap import bootstrap_draws
from scalectl.curve.solvers import (
    GRID_BLOCK_ELEMENTS,
    MAX_FIT_POINTS,
    bin_points,
    block_rows,
)
from scalectl.defaults import MAX_BOOTSTRAP

#: Float64 bytes.
F8 = 8


def _curve(n: int, seed: int = 0, sd: float = 0.01):
    """The paper's batch-2048 curve (Table 1: A 0.645, B 1.70, C_mid 10,909, R0 0.3) at n
    points over 0..50,000 GPU-hours, noise sd ``sd``."""
    x = np.linspace(0.0, 50_000.0, n)
    y = np.clip(sigmoid(x, 0.645, 1.70, 10909.0, 0.3) + np.random.default_rng(seed).normal(0, sd, n), 0, 1)
    return x, y


@pytest.mark.parametrize("n", [10, 100, 2_000, 300_000, 5_000_000])
def test_every_grid_block_holds_at_most_the_budget(n):
    budget_bytes = GRID_BLOCK_ELEMENTS * F8
    assert budget_bytes == 8 << 20
    vp_rows = block_rows(n)                       # (C_mid, B) pairs x n points of the vp start
    assert vp_rows * n * F8 <= budget_bytes or (vp_rows == 1 and n > GRID_BLOCK_ELEMENTS)
    scan_rows = block_rows(16 * n)                # C_mid values x 16 B values x n points of the grid
    assert scan_rows * 16 * n * F8 <= budget_bytes or scan_rows == 1
    # the 1152-pair vp grid of a 300,000-point window was one array of 2.6 GiB; now 3 rows, 7.2 MB
    if n == 300_000:
        assert (vp_rows, vp_rows * n * F8) == (3, 7_200_000)
        assert 1152 * n * F8 / 2**30 > 2.5
    # the bootstrap of a binned window: 1,000 resamples in blocks of 524 x 2,000 points, 8.4 MB
    if n == MAX_FIT_POINTS:
        assert (vp_rows, math.ceil(1000 / vp_rows)) == (524, 2)


def test_blocks_change_no_estimate(monkeypatch):
    x, y = _curve(60, seed=3)
    whole = {m: fit_sigmoid(x, y, min_compute=1500, bootstrap=0, method=m) for m in ("vp", "grid")}
    monkeypatch.setattr(solvers, "GRID_BLOCK_ELEMENTS", 5_000)    # 14 blocks of the vp grid, 20 of the B scan
    assert (block_rows(60), block_rows(16 * 60)) == (83, 5)
    for method, fit in whole.items():
        small = fit_sigmoid(x, y, min_compute=1500, bootstrap=0, method=method)
        assert (small.A, small.B, small.C_mid, small.R0) == (fit.A, fit.B, fit.C_mid, fit.R0), method


def test_bootstrap_blocks_and_its_limit(monkeypatch):
    x, y = _curve(200, seed=1)
    fit = fit_sigmoid(x, y, min_compute=1500, bootstrap=400, seed=5)
    monkeypatch.setattr(solvers, "GRID_BLOCK_ELEMENTS", 200 * 50)    # 50 resamples a block: 8 blocks
    blocked = fit_sigmoid(x, y, min_compute=1500, bootstrap=400, seed=5)
    assert blocked.samples.shape == fit.samples.shape == (400, 4)
    assert blocked.A == fit.A
    # other draws, the same distribution: the interval ends agree within a few of their own
    # Monte Carlo errors (sd of a 2.5 % quantile of 400 draws ~ 0.8 x the draws' sd / sqrt(400) x 3)
    sd = float(np.std(fit.samples[:, 0]))
    for a, b in zip(blocked.interval("A"), fit.interval("A")):
        assert abs(a - b) < 4 * 0.8 * 3 * sd / math.sqrt(400)
    from scalectl.curve import FitError

    with pytest.raises(FitError, match="bootstrap resamples must lie in 1..100,000"):
        bootstrap_draws(np.array([0.6, 9.0, 1.7, 0.3]), np.ones(4, bool), np.log(x[1:]), y[1:], y[1:] * 0, 0,
                        np.zeros(4), np.ones(4) * 20, MAX_BOOTSTRAP + 1, 0)


def test_fit_memory_stays_within_its_blocks():
    n = 40_000
    x, y = _curve(n)
    tracemalloc.start()
    try:
        fit = fit_sigmoid(x, y, min_compute=1500, bootstrap=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # at most 16 arrays of one block alive at once (the refits' targets, curve, fractions,
    # residuals, 4 Jacobian columns and their trial copies), and 32 arrays of the points
    # (log compute, targets, residuals, the bounded solver's n x 4 Jacobian and its copies);
    # before the blocks, the vp grid alone was 1152 x 40,000 x 8 B = 352 MiB (peak 1,026 MiB)
    bound = 16 * GRID_BLOCK_ELEMENTS * F8 + 32 * n * F8
    assert peak < bound, (peak / 2**20, bound / 2**20)
    assert abs(fit.A - 0.645) < 0.002


def test_bins_are_equal_counts_of_consecutive_points():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    y = np.array([0.1, 0.3, 0.2, 0.4, 0.9])
    t = np.array([0.05, np.nan, np.nan, 0.2, 0.1])
    xb, yb, tb, counts = bin_points(x, y, t, max_points=2)
    assert counts.tolist() == [2, 3]                 # sizes differ by at most one
    assert xb == pytest.approx([math.sqrt(2.0), (3.0 * 4.0 * 5.0) ** (1 / 3)], rel=1e-12)
    assert yb == pytest.approx([0.2, 0.5], rel=1e-12)
    assert tb.tolist() == [0.05, 0.2]                # the largest truncation rate, NaN ignored
    same = bin_points(x, y, t, max_points=5)
    assert same[0] is x and same[3].tolist() == [1] * 5
    with pytest.raises(ValueError, match="compute > 0"):
        bin_points(np.array([0.0, 1.0, 2.0]), y[:3], None, max_points=2)


def test_a_long_stored_run_is_fitted_on_bins(tmp_path):
    from scalectl.science.fits import FitOptions, fit_run
    from scalectl.store.database import Store

    n = 3 * MAX_FIT_POINTS + 1
    x, y = _curve(n, seed=2)
    logged: list[str] = []
    with Store.open(tmp_path / "s.db") as store:
        run_id = store.create_run("long", status="completed")
        store.add_points(run_id, [{"step": i, "gpu_hours": float(a), "pass_rate": float(b)}
                                  for i, (a, b) in enumerate(zip(x, y))])
        # log: where the command prints its lines
        curve, _cached, key = fit_run(store, store.get_run("long"), FitOptions(bootstrap=200), log=logged.append)
    window = int(np.sum(x >= 1500))      # the recipe-less default window: 1,500 GPU-hours (paper A.5)
    assert curve.fit.n_points == MAX_FIT_POINTS and key.endswith(f"/bins={MAX_FIT_POINTS}")
    assert logged == [(f"run long: {window:,} points in the fit window, fitted as 2,000 bins of 2-3 consecutive "
                       "points (mean pass rate at the geometric mean compute; docs/fitting.md)")]
    lo, hi = curve.fit.interval("A")
    assert lo <= 0.645 <= hi and hi - lo < 0.01
    assert len(curve.compute) == n       # the run's own points stay the curve's data
