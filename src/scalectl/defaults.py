"""Numbers of the method that several parts of scalectl must agree on.

* :data:`MARGIN`: ceilings A closer than this are a tie.  Three repeated runs of
  one recipe gave ceilings within +-0.015 (Khatri et al. 2025, "The Art of
  Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786,
  section 3), hence 0.02.
* :data:`TRUNCATION_THRESHOLD`: a run whose held-out truncation rate exceeds
  this share is flagged; runs past 10-15% truncation became unstable (same
  paper, section 3, length control).
"""

from __future__ import annotations

#: Noise margin on the ceiling A (pass rate, absolute).
MARGIN = 0.02
#: Truncation rate above which a fit is flagged (share of completions, in [0, 1]).
TRUNCATION_THRESHOLD = 0.10
