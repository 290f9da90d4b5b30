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
* :data:`IDENTIFY_REACH`: the one rule of "enough data": a run's fit identifies its
  ceiling A once its points reach this multiple of its C_mid.  The fit's advice asks
  for it (:func:`scalectl.curve.advise`), ``ablate --plan`` budgets it and proposes seed
  runs only at it (:mod:`scalectl.ablation.staged`), ``ablate --until-decided`` judges no
  ceiling before it (:data:`scalectl.ablation.decisions.MIN_REACH`), and the study checks
  its budget against it (``scripts/study.py``).  Measured with ``scripts/reach_rule.py``
  (docs/fitting.md, "How far a run must go"): on 160 simulated runs per reach with the noise
  of real tiny runs, the error of one run's A has sd 0.047, 0.020, 0.013, 0.0091 and 0.0075
  at 2, 3, 4, 5 and 6 x C_mid, and its 95 % interval lies within 2 x the margin in 3 %,
  31 %, 66 %, 86 % and 89 % of the runs: 5 is the least reach at which the sd is within
  half the margin (0.01).  The default setup's two long real runs agree: fitted at 2.5-3.5 x
  C_mid their A lay 0.014-0.020 above the fit at 5 x, whose intervals were 0.023-0.030 wide.
"""

from __future__ import annotations

#: Noise margin on the ceiling A (pass rate, absolute).
MARGIN = 0.02
#: Truncation rate above which a fit is flagged (share of completions, in [0, 1]).
TRUNCATION_THRESHOLD = 0.10
#: Most bootstrap resamples of one fit (derived in the module docstring).
MAX_BOOTSTRAP = 100_000
#: Reach past the midpoint (last compute / C_mid) at which a fit's ceiling counts as identified
#: (derived in the module docstring).
IDENTIFY_REACH = 5.0
