"""Power planning of an ablation: the budget and seeds that resolve a difference of the margin.

Before spending anything, ``scalectl ablate FILE --plan`` answers: how long must
each run be for its ceiling to be identified, how many seeds per variant make
the interval of dA = A_variant - A_base narrow enough for a verdict, and what
does that cost?

* **Budget.** The ceiling is identified when the data reach well past the
  midpoint: the one rule of enough data, :data:`scalectl.defaults.IDENTIFY_REACH`
  = 5 x C_mid (measured in docs/fitting.md, "How far a run must go"), which
  :func:`scalectl.curve.advise` asks for and the adaptive loop waits for before a
  verdict (its ``min_reach``); the fit's ``ceiling_not_identified`` flag, at
  >= 1.5 x C_mid and 3 points past it, is only the least that can be fitted.  In
  steps: :func:`scalectl.curve.planning.identifying_steps`, reach x C_mid /
  (compute per step).
* **Seeds.** With n seeds per arm the A interval of an arm has half-width
  h(n) = z sqrt(s_fit^2 + s_seed^2) / sqrt(n), where s_fit is the sd of A from
  one run's fit (bootstrap) and s_seed the seed-to-seed sd (Khatri et al.
  2025, arXiv 2510.13786, section 3: three seeds within +-0.015).  The dA
  interval adds two such half-widths in quadrature: sqrt(2) h(n).  A
  difference of the margin is *resolved* when that half-width is at most
  margin / 2: the adaptive loop calls a tie when the interval of dA lies
  inside +-margin and a difference when it lies beyond it
  (:data:`scalectl.ablation.decisions.CLAIM`), so a true tie (dA = 0) is then
  called a tie in about ``level`` of the draws and a true difference of twice
  the margin higher or lower in about 1 - (1 - level) / 2.  Hence
  n = ceil(2 z^2 (s_fit^2 + s_seed^2) / (margin / 2)^2).
* **Cost.** arms x n x budget x (device-hours per step); wall-clock: the
  arms x n runs, ``parallel`` at a time (``launcher.max_parallel``), each budget x
  (seconds per step).

Pure functions; the command feeds them the base's stored fit or stated assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from scalectl.curve.planning import identifying_steps
from scalectl.defaults import IDENTIFY_REACH


@dataclass(frozen=True)
class PowerPlan:
    """What resolving a difference of ``margin`` needs.

    budget_steps: optimiser steps per run; seeds: runs per arm; arms: variants
    plus the base; device_hours: total expected cost (None without a rate);
    half_width: the dA half-width reached with ``seeds``; s_fit, s_seed: the
    sds used (pass rate); reach: budget compute / C_mid; capped: a cap cut
    the budget or seeds, whose uncapped values are ``budget_uncapped`` and
    ``seeds_uncapped``; seconds_per_step: wall-clock seconds per step (None: not
    known); parallel: runs trained at once; wall_seconds: the wall-clock of all the
    runs (None without a seconds rate).
    """

    budget_steps: int
    seeds: int
    arms: int
    device_hours: float | None
    half_width: float
    s_fit: float
    s_seed: float
    reach: float
    margin: float
    capped: bool = False
    seeds_uncapped: int = 0
    budget_uncapped: int = 0
    seconds_per_step: float | None = None
    parallel: int = 1
    wall_seconds: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def seeds_needed(s_fit: float, s_seed: float, margin: float, level: float = 0.95) -> int:
    """Seeds per arm so that the dA interval's half-width is <= margin / 2 (module docstring).

    s_fit, s_seed >= 0 (pass rate); margin > 0.  Raises ValueError otherwise.
    """
    if s_fit < 0 or s_seed < 0 or margin <= 0:
        raise ValueError(f"need s_fit >= 0, s_seed >= 0, margin > 0 (given {s_fit}, {s_seed}, {margin})")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return max(1, math.ceil(2 * z * z * (s_fit ** 2 + s_seed ** 2) / (margin / 2) ** 2 - 1e-9))


def delta_half_width(s_fit: float, s_seed: float, seeds: int, level: float = 0.95) -> float:
    """Half-width of the dA interval with ``seeds`` runs per arm: sqrt(2) z sqrt(s_fit^2 + s_seed^2 / ...)/sqrt(n)."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return math.sqrt(2) * z * math.sqrt(s_fit ** 2 + s_seed ** 2) / math.sqrt(seeds)


def wall_seconds(runs: int, steps: int, seconds_per_step: float | None, parallel: int = 1) -> float | None:
    """Wall-clock seconds of ``runs`` runs of ``steps`` steps each, ``parallel`` at a time
    (whole waves: ceil(runs / parallel) x steps x seconds_per_step); None without a rate."""
    if seconds_per_step is None:
        return None
    return math.ceil(runs / max(1, parallel)) * steps * seconds_per_step


def plan_power(*, C_mid: float, compute_per_step: float, s_fit: float, s_seed: float, arms: int,
               margin: float = 0.02, hours_per_step: float | None = None, step_multiple: int = 1,
               max_budget: int | None = None, max_seeds: int | None = None, level: float = 0.95,
               reach: float = IDENTIFY_REACH, seconds_per_step: float | None = None, parallel: int = 1) -> PowerPlan:
    """Budget, seeds and cost to resolve a difference of ``margin`` (module docstring).

    C_mid and compute_per_step on one compute axis (e.g. device-hours and
    device-hours per step); s_fit: sd of A from one run's fit at that budget
    (e.g. a 95 % bootstrap half-width / 1.96); s_seed: seed-to-seed sd of A;
    arms: variants + base; reach: the budget's compute as a multiple of C_mid
    (default :data:`~scalectl.defaults.IDENTIFY_REACH`); hours_per_step: device-hours per optimiser step
    (None: no cost); max_budget / max_seeds: caps (``capped`` says one bit);
    seconds_per_step, parallel: the wall-clock rate and the runs trained at once.
    Raises ValueError on non-positive C_mid, compute_per_step or arms.
    """
    if C_mid <= 0 or compute_per_step <= 0 or arms < 1:
        raise ValueError(f"need C_mid > 0, compute_per_step > 0 and arms >= 1 "
                         f"(given {C_mid}, {compute_per_step}, {arms})")
    budget = identifying_steps(C_mid, compute_per_step, step_multiple, reach)
    seeds = seeds_needed(s_fit, s_seed, margin, level)
    want_budget, want_seeds, capped = budget, seeds, False
    if max_budget is not None and budget > max_budget:
        budget, capped = max_budget, True
    if max_seeds is not None and seeds > max_seeds:
        seeds, capped = max_seeds, True
    hours = None if hours_per_step is None else arms * seeds * budget * hours_per_step
    return PowerPlan(budget, seeds, arms, hours, delta_half_width(s_fit, s_seed, seeds, level), s_fit, s_seed,
                     budget * compute_per_step / C_mid, margin, capped, want_seeds, want_budget,
                     seconds_per_step, parallel, wall_seconds(arms * seeds, budget, seconds_per_step, parallel))
