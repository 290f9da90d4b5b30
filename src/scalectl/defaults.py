"""Numbers of the method that several parts of scalectl must agree on.

* :data:`MARGIN`: ceilings A closer than this are a tie.  Three repeated runs of
  one recipe gave ceilings within +-0.015 (Khatri et al. 2025, "The Art of
  Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786,
  section 3), hence 0.02.
* :data:`MAX_BOOTSTRAP`: the most bootstrap resamples of one fit.  The refits run in
  blocks of resamples (:data:`scalectl.curve.solvers.GRID_BLOCK_ELEMENTS` elements per
  array), so what grows with the resamples is what each keeps: its 4 parameters (twice, as
  drawn and as named) and, in a prediction band over a plotted grid of 300 compute values
  (:mod:`scalectl.present.plot`), its curve, its noise and their sum: 3 x 300 float64 =
  7.2 kB per resample.  1 GiB / 7.2 kB = 149,000; rounded down, 100,000 resamples keep
  that under 0.75 GB (a 95 % interval then rests on 2,500 draws in each tail).
* :data:`TRUNCATION_THRESHOLD`: a run whose held-out truncation rate exceeds
  this share is flagged; runs past 10-15% truncation became unstable (same
  paper, section 3, length control).
"""

from __future__ import annotations

#: Noise margin on the ceiling A (pass rate, absolute).
MARGIN = 0.02
#: Truncation rate above which a fit is flagged (share of completions, in [0, 1]).
TRUNCATION_THRESHOLD = 0.10
#: Most bootstrap resamples of one fit (derived in the module docstring).
MAX_BOOTSTRAP = 100_000
