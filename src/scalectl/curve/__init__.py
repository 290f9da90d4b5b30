"""The compute-scaling sigmoid of ScaleRL, its fit, intervals and warnings.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

(Khatri et al. 2025, "The Art of Scaling RL Compute for LLMs", arXiv 2510.13786,
eq. 1 in section 3; fitting procedure in appendix A.5).

* :mod:`scalectl.curve.model`: the formula and the fit result (:class:`SigmoidFit`).
* :mod:`scalectl.curve.fit`: :func:`fit_sigmoid` (its settings :class:`FitSettings`), its window and flags.
* :mod:`scalectl.curve.solvers`: the grid, variable projection and batched
  Levenberg-Marquardt.
* :mod:`scalectl.curve.bootstrap`: the resampling behind intervals and bands.
* :mod:`scalectl.curve.profile`: the profile likelihood of the ceiling A (is it identified?).
* :mod:`scalectl.curve.planning`: seed spread and advice (extend, or add seeds).

The names below are the public surface; import them from ``scalectl.curve``.
"""

from scalectl.curve.fit import (FitSettings, default_min_compute, detect_late_decline, evaluation_standard_error,
                                fit_sigmoid)
from scalectl.curve.model import (MIN_POINTS, MIN_POINTS_BEFORE_MIDPOINT, MIN_POINTS_PAST_MIDPOINT,
                                  MIN_REACH_PAST_MIDPOINT, PAPER_A_GRID, PAPER_C_MID_GRID,
                                  PAPER_MIN_COMPUTE, PARAM_NAMES, TRUNCATION_THRESHOLD, Bounds,
                                  FitError, Flag, GridSpec, SigmoidFit, sigmoid)
from scalectl.curve.planning import Advice, Spread, StepRate, advise, seed_spread, step_rate
from scalectl.curve.solvers import resolve_grid

__all__ = [
    "MIN_POINTS", "MIN_POINTS_BEFORE_MIDPOINT", "MIN_POINTS_PAST_MIDPOINT", "MIN_REACH_PAST_MIDPOINT",
    "PAPER_A_GRID", "PAPER_C_MID_GRID", "PAPER_MIN_COMPUTE", "PARAM_NAMES", "TRUNCATION_THRESHOLD",
    "Advice", "Bounds", "FitError", "FitSettings", "Flag", "GridSpec", "SigmoidFit", "Spread", "StepRate", "advise",
    "default_min_compute", "detect_late_decline", "evaluation_standard_error", "fit_sigmoid", "resolve_grid", "seed_spread",
    "sigmoid", "step_rate",
]
