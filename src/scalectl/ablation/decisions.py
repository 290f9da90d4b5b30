"""Decision rules of an adaptive ablation: after a stage, what each variant does next.

An adaptive ablation (``scalectl ablate --until-decided``) trains every
variant and the base to an initial budget, then after each stage fits and
compares every variant with the base (:func:`scalectl.science.compare.compare`, margin
0.02) and decides per variant (docs/ablations.md, "Until decided"):

* **decided**: "higher ceiling" or "lower ceiling" with the whole interval of
  dA beyond the margin (``claim`` = 1: the interval on one side of +-margin,
  as a tie needs it inside), or a tie ("tie on ceiling, faster/slower"): stop
  it;
* **ceiling not identified** (flagged by the fit, or data short of
  ``min_reach`` x C_mid, the one rule of enough data
  :data:`scalectl.defaults.IDENTIFY_REACH` = 5, which :func:`scalectl.curve.advise`
  and ``ablate --plan`` use too): extend it to that reach, at most ``max_growth``
  times the current budget and at most ``max_budget``;
* **identified, but the interval of the difference of ceilings straddles the
  margin**: the width is noise, so add a seed (at most ``max_seeds``) to
  whichever of the variant and the base has the wider A interval (both when
  they are within 25 % of each other): the dA interval adds the two
  half-widths in quadrature, so narrowing the wider one helps most;
* **cannot win any more**: its upper bound on A lies below the base's lower
  bound minus the margin (with ``race``: below the best lower bound of any
  arm): stop it, "lower ceiling" (against another arm: "cannot win");
* at ``max_seeds``: extend it, unless the seed-to-seed part of the dA
  interval, z sd_seed sqrt(1/n_variant + 1/n_base), which no extension
  narrows, already rules out both a tie (it needs floor < margin - |dA|) and
  a difference (|dA| - floor > claim x margin): then stop, "undecided";
* **a run that declines after a peak** (the variant's or the base's fit
  flagged ``late_decline``): the sigmoid does not describe it and a longer
  run identifies no ceiling: stop it, "undecided";
* nothing left to try (at ``max_budget`` and ``max_seeds``): stop it,
  "undecided"; :func:`needed` says what a verdict would take beyond them.

Intervals on A include the seed-to-seed spread (:func:`widen_for_seeds`): a
fit's residual bootstrap treats the evaluation points as independent, but
repeated runs of one recipe end at different ceilings (Khatri et al. 2025,
arXiv 2510.13786, section 3: three seeds within +-0.015, the origin of the
0.02 margin), so the interval of A for n pooled seeds is at least
z * sd_seed / sqrt(n) on each side.  sd_seed is pooled over the arms that
have several seeds, with a prior (default 0.0075: +-0.015 read as two
standard deviations) counting as ``prior_df`` degrees of freedom.

Everything here is pure: fits in, decisions out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from scalectl.science.compare import FASTER, HIGHER, LOWER, SLOWER, SPEED_UNDECIDED, UNDECIDED, Comparison
from scalectl.curve import SigmoidFit
from scalectl.curve.planning import identifies
from scalectl.defaults import IDENTIFY_REACH

STOP, EXTEND, SEED, HOLD = "stop", "extend", "seed", "hold"
ACTIONS = (STOP, EXTEND, SEED, HOLD)
CANNOT_WIN = "cannot win"
#: Verdicts that stop a variant: a ceiling decided, or tied (whatever its speed verdict).
DECIDED = (HIGHER, LOWER, FASTER, SLOWER, SPEED_UNDECIDED)
TIES = (FASTER, SLOWER, SPEED_UNDECIDED)
#: The paper's three seeds within +-0.015 (section 3), read as +-2 standard deviations.
PRIOR_SEED_SD = 0.0075
#: Weight of the prior seed sd, in degrees of freedom of the pooled estimate.
PRIOR_DF = 4.0
#: A ceiling counts as identified for a verdict once the data reach this multiple of
#: C_mid: the one rule of enough data, :data:`scalectl.defaults.IDENTIFY_REACH` (what
#: :func:`scalectl.curve.advise` asks for and ``ablate --plan`` budgets; measured in
#: docs/fitting.md, "How far a run must go").
MIN_REACH = IDENTIFY_REACH
#: "higher"/"lower" stops a variant only when the interval of dA also lies beyond
#: +-CLAIM x margin.  At 1 a verdict says on which side of the margin the true
#: difference lies only when the whole interval lies there, as the tie rule asks
#: the interval to lie inside it: a true difference just inside (or outside) the
#: margin is then called beyond it (or a tie) in at most (1 - level) / 2 of the
#: looks.  A smaller share leaves differences between claim x margin and the
#: margin to the point estimate (docs/ablations.md, "Wrong and undecided").
CLAIM = 1.0
#: The fit's flag of a pass rate that falls after a peak (:func:`scalectl.curve.detect_late_decline`).
DECLINE = "late_decline"
#: Interval half-widths within this ratio count as equal when choosing which arm gets a seed.
WIDTH_TIE = 1.25


@dataclass(frozen=True)
class Limits:
    """What an adaptive ablation may spend per run and per variant.

    margin: noise margin on A (paper 0.02); max_budget: optimiser steps per
    run at most; max_seeds: runs per variant at most; step_multiple: budgets
    are rounded up to a multiple of this (the evaluation interval, so the last
    step is an evaluation step); max_growth: an extension at most multiplies
    the budget by this; min_growth: and at least by this; race: "cannot win"
    against any arm, not only the base; min_reach: the reach past C_mid a
    ceiling needs before a verdict (:data:`MIN_REACH`); claim: the share of the
    margin the interval of dA must lie beyond for "higher"/"lower"
    (:data:`CLAIM`); seed_sd / prior_df: the prior of the seed-to-seed sd of A.
    """

    max_budget: int
    max_seeds: int = 6
    margin: float = 0.02
    step_multiple: int = 1
    max_growth: float = 4.0
    min_growth: float = 1.5
    race: bool = False
    min_reach: float = MIN_REACH
    claim: float = CLAIM
    seed_sd: float = PRIOR_SEED_SD
    prior_df: float = PRIOR_DF

    def __post_init__(self):
        for name, ok in (("max_budget", self.max_budget >= 1), ("max_seeds", self.max_seeds >= 1),
                         ("margin", self.margin > 0), ("step_multiple", self.step_multiple >= 1),
                         ("claim", 0 <= self.claim <= 1), ("min_reach", self.min_reach >= 0),
                         ("max_growth", self.max_growth >= self.min_growth > 1),
                         ("seed_sd", self.seed_sd >= 0), ("prior_df", self.prior_df >= 0)):
            if not ok:
                raise ValueError(f"limits: {name} = {getattr(self, name)!r} is out of range")


@dataclass(frozen=True)
class Arm:
    """One variant (or the base) after a stage.

    budget: optimiser steps of each of its runs; seeds: how many runs;
    fit: the fit of its pooled seeds, A interval already widened by
    :func:`widen_for_seeds` (None when it could not be fitted, see ``error``);
    compute_per_step: fit-axis compute per optimiser step (to turn the advised
    compute into steps); stopped: the verdict it was stopped with in an
    earlier stage (None while it is still running).
    """

    name: str
    budget: int
    seeds: int
    fit: SigmoidFit | None
    compute_per_step: float | None = None
    is_base: bool = False
    stopped: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Decision:
    """What one arm does next: ``action`` (stop, extend, seed, hold), its
    verdict so far, why, and its budget and seeds for the next stage."""

    name: str
    action: str
    verdict: str
    reason: str
    budget: int
    seeds: int

    def to_dict(self) -> dict:
        return {"name": self.name, "action": self.action, "verdict": self.verdict,
                "reason": self.reason, "budget": self.budget, "seeds": self.seeds}


# --------------------------------------------------------------------------- seed spread


def pooled_seed_sd(per_seed_A: Mapping[str, Sequence[float]], prior_sd: float = PRIOR_SEED_SD,
                   prior_df: float = PRIOR_DF) -> tuple[float, float]:
    """Seed-to-seed sd of A pooled over arms, shrunk towards a prior.

    per_seed_A: arm -> the A fitted to each of its seeds alone (arms with one
    seed add nothing).  s^2 = (sum_arms sum_seeds (A - mean_arm)^2 +
    prior_df * prior_sd^2) / (sum_arms (n - 1) + prior_df): the prior counts as
    prior_df degrees of freedom.  Returns (sd, degrees of freedom of the data).
    """
    ss, df = 0.0, 0.0
    for values in per_seed_A.values():
        v = [float(a) for a in values]
        if len(v) >= 2:
            m = sum(v) / len(v)
            ss += sum((a - m) ** 2 for a in v)
            df += len(v) - 1
    if df + prior_df == 0:
        return prior_sd, 0.0
    return math.sqrt((ss + prior_df * prior_sd ** 2) / (df + prior_df)), df


def widen_for_seeds(fit: SigmoidFit, n_seeds: int, seed_sd: float) -> SigmoidFit:
    """The fit with its A interval widened to the seed-to-seed spread.

    ``seed_sd`` is the sd of the A of one seed fitted alone (everything that
    varies between runs: training, evaluation noise, fit).  The mean of n seeds
    has sd seed_sd / sqrt(n), so each side's half-width h becomes
    max(h, z seed_sd / sqrt(n)), z the normal quantile of the fit's level (1.96
    at 95 %).  A fit without an A interval gets the seed part alone.  Raises
    ValueError when n_seeds < 1.
    """
    from statistics import NormalDist

    if n_seeds < 1:
        raise ValueError(f"n_seeds = {n_seeds} must be >= 1")
    z = NormalDist().inv_cdf(0.5 + fit.level / 2)
    extra = z * seed_sd / math.sqrt(n_seeds)
    lo, hi = fit.interval("A") or (fit.A, fit.A)
    intervals = dict(fit.intervals)
    intervals["A"] = (fit.A - max(fit.A - lo, extra), fit.A + max(hi - fit.A, extra))
    return replace(fit, intervals=intervals)


# --------------------------------------------------------------------------- rules


def ceiling_identified(fit: SigmoidFit | None, min_reach: float = 0.0) -> bool:
    """Whether a fit pins its ceiling: no ``ceiling_not_identified`` flag, A off its
    bounds, and its last point at >= ``min_reach`` x C_mid (:func:`scalectl.curve.planning.identifies`)."""
    return fit is not None and identifies(fit, min_reach)


def round_up(steps: float, multiple: int) -> int:
    """``steps`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(multiple, int(math.ceil(steps / multiple - 1e-9)) * multiple)


def extended_budget(arm: Arm, limits: Limits) -> int:
    """The budget that reaches ``limits.min_reach`` x C_mid (:data:`MIN_REACH` by default, the rule
    :func:`scalectl.curve.advise` asks for too).

    In steps: min_reach C_mid / compute_per_step, at least ``min_growth`` and at most
    ``max_growth`` times the current budget, rounded up to ``step_multiple``,
    capped by ``max_budget``.  Without a fit or a compute rate: ``min_growth``
    times the budget (same caps).
    """
    target = arm.budget * limits.min_growth
    if arm.fit is not None and arm.compute_per_step and arm.compute_per_step > 0:
        target = max(target, limits.min_reach * arm.fit.C_mid / arm.compute_per_step)
    target = min(target, arm.budget * limits.max_growth)
    return min(limits.max_budget, round_up(target, limits.step_multiple))


def _half_width(fit: SigmoidFit | None) -> float:
    if fit is None or fit.interval("A") is None:
        return math.inf
    lo, hi = fit.interval("A")
    return (hi - lo) / 2


def _a_bounds(arm: Arm, min_reach: float) -> tuple[float, float] | None:
    """(lo, hi) of A of an arm whose ceiling is identified, else None."""
    if not ceiling_identified(arm.fit, min_reach):
        return None
    return arm.fit.interval("A") or (arm.fit.A, arm.fit.A)


def _seed_floor(arm: Arm, base: Arm, seed_sd: float) -> float:
    """The part of the dA half-width that no extension narrows: z sd sqrt(1/n_arm + 1/n_base)."""
    from statistics import NormalDist

    level = arm.fit.level if arm.fit is not None else 0.95
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return z * seed_sd * math.sqrt(1 / arm.seeds + 1 / base.seeds)


def decide(arms: Sequence[Arm], comparison: Comparison | None, limits: Limits,
           seed_sd: float | None = None) -> dict[str, Decision]:
    """Next step of every arm after a stage.

    arms: the base (``is_base``) and the variants; comparison: the result of
    :func:`scalectl.science.compare.compare` over the arms still running plus the base
    (rows named like the arms; None when the base could not be fitted).
    seed_sd: the seed-to-seed sd of A in use (default ``limits.seed_sd``): a
    variant at ``max_seeds`` is extended only while a verdict is within reach
    of the interval part that extension does not narrow.
    Returns arm name -> :class:`Decision`; the base's decision says whether
    it is extended or seeded for the others' sake (``hold`` otherwise;
    ``stop`` once nothing is running).  Raises ValueError when there is not
    exactly one base.

    The rules, in order, for each variant still running (the module's docstring):
    a decline after a peak (:func:`_declining`), a verdict whose dA interval reaches
    within the claim (:func:`_claimed`), a variant that cannot win (:func:`_cannot_win`),
    a ceiling not identified (:func:`_extend`), else seeds (:func:`_seeds`).
    """
    bases = [a for a in arms if a.is_base]
    if len(bases) != 1:
        raise ValueError(f"an adaptive ablation needs exactly one base arm, got {len(bases)}")
    stage = _Stage(bases[0], comparison, limits, limits.seed_sd if seed_sd is None else seed_sd,
                   {a.name: _a_bounds(a, limits.min_reach) for a in arms})
    stage.rivals = [a for a in arms if stage.identified[a.name] is not None and (limits.race or a.is_base)]
    out = {arm.name: _decide_variant(arm, stage) for arm in arms if not arm.is_base}
    out[stage.base.name] = _decide_base(stage, out)
    return out


@dataclass
class _Stage:
    """What every variant's decision reads (the base, the comparison, the limits, the seed sd,
    each arm's identified A bounds and the rivals it cannot win against), and what the base
    is asked for by the variants: an extension, a seed (and for whom)."""

    base: Arm
    comparison: Comparison | None
    limits: Limits
    seed_sd: float
    identified: dict[str, tuple[float, float] | None]
    rivals: list[Arm] = field(default_factory=list)
    base_extend: bool = False
    base_seed: bool = False
    base_reasons: list[str] = field(default_factory=list)


def _decide_variant(arm: Arm, stage: _Stage) -> Decision:
    base = stage.base
    if arm.stopped is not None:
        return Decision(arm.name, STOP, arm.stopped, "decided in an earlier stage", arm.budget, arm.seeds)
    row = None
    if stage.comparison is not None:
        try:
            row = stage.comparison.row(arm.name)
        except KeyError:
            row = None
    verdict = row.verdict if row is not None else UNDECIDED
    reason = row.reason if row is not None else (arm.error or base.error or "not compared")
    declined = _declining(arm, base)
    if declined is not None:
        return declined
    verdict, reason = _claimed(verdict, reason, row, stage.limits)
    if verdict in DECIDED:
        return Decision(arm.name, STOP, verdict, reason, arm.budget, arm.seeds)
    beaten = _cannot_win(arm, stage)
    if beaten is not None:
        return beaten
    arm_ok = ceiling_identified(arm.fit, stage.limits.min_reach)
    base_ok = ceiling_identified(base.fit, stage.limits.min_reach)
    if not arm_ok or not base_ok:
        return _extend(arm, arm_ok, base_ok, stage)
    return _seeds(arm, row, reason, stage)


def _declining(arm: Arm, base: Arm) -> Decision | None:
    """Stop, undecided, a variant whose run or the base's declines after a peak."""
    falling = [a.name for a in (arm, base) if a.fit is not None and a.fit.has_flag(DECLINE)]
    if not falling:
        return None
    return Decision(
        arm.name, STOP, UNDECIDED,
        f"the pass rate of {' and '.join(falling)} {'declines' if len(falling) == 1 else 'decline'} "
        f"after a peak ({DECLINE}): the sigmoid "
        "does not describe the run, and a longer run does not identify a ceiling", arm.budget, arm.seeds)


def _claimed(verdict: str, reason: str, row, limits: Limits) -> tuple[str, str]:
    """(verdict, reason): "higher"/"lower" stands only when the interval of dA also excludes
    +-claim x margin; else undecided, saying why."""
    if verdict in (HIGHER, LOWER) and row is not None:
        lo, hi = row.delta_A_interval
        bound = limits.claim * limits.margin
        if (verdict == HIGHER and lo <= bound) or (verdict == LOWER and hi >= -bound):
            return UNDECIDED, (f"{verdict}, but the interval of dA [{lo:+.3f}, {hi:+.3f}] reaches within "
                               f"+-{bound:.3f}")
    return verdict, reason


def _cannot_win(arm: Arm, stage: _Stage) -> Decision | None:
    """Stop a variant whose upper bound on A lies below a rival's lower bound minus the margin
    ("lower ceiling" against the base, "cannot win" against another variant)."""
    mine = stage.identified[arm.name]
    if mine is None:
        return None
    margin = stage.limits.margin
    beaten = [(r, stage.identified[r.name][0]) for r in stage.rivals
              if r.name != arm.name and mine[1] < stage.identified[r.name][0] - margin]
    if not beaten:
        return None
    rival, lo = max(beaten, key=lambda t: t[1])
    v = LOWER if rival.is_base else CANNOT_WIN
    return Decision(arm.name, STOP, v, f"upper bound of A {mine[1]:.3f} < lower bound of {rival.name} "
                                       f"{lo:.3f} - margin {margin:.3f}", arm.budget, arm.seeds)


def _extend(arm: Arm, arm_ok: bool, base_ok: bool, stage: _Stage) -> Decision:
    """A ceiling not identified: extend the variant (and ask the base to be extended) within
    the limits; stop, undecided, when neither can be."""
    base, limits = stage.base, stage.limits
    action, budget, why, progress = HOLD, arm.budget, [], False
    if not arm_ok:
        new = extended_budget(arm, limits)
        if new > arm.budget:
            action, budget, progress = EXTEND, new, True
            why.append(f"ceiling of {arm.name} not identified: extend to {new} steps")
        else:
            why.append(f"ceiling of {arm.name} not identified at --max-budget {limits.max_budget}")
    if not base_ok:
        if extended_budget(base, limits) > base.budget:
            stage.base_extend, progress = True, True
            why.append(f"ceiling of {base.name} not identified: the base is extended")
        else:
            why.append(f"ceiling of {base.name} not identified at --max-budget {limits.max_budget}")
    if not progress:
        return Decision(arm.name, STOP, UNDECIDED, "; ".join(why) + ": nothing left to try", arm.budget, arm.seeds)
    return Decision(arm.name, action, UNDECIDED, "; ".join(why), budget, arm.seeds)


def _seeds(arm: Arm, row, reason: str, stage: _Stage) -> Decision:
    """Both ceilings identified, the interval of dA straddling the margin (noise): a seed to
    the wider of the two A intervals (both within :data:`WIDTH_TIE`), else to the other; at
    ``max_seeds`` on both, an extension while a verdict is within reach, else stop."""
    base, limits = stage.base, stage.limits
    h_arm, h_base = _half_width(arm.fit), _half_width(base.fit)
    seed_arm = h_arm * WIDTH_TIE >= h_base
    seed_base = h_base * WIDTH_TIE >= h_arm
    can_arm = arm.seeds < limits.max_seeds
    can_base = base.seeds < limits.max_seeds
    seed = Decision(arm.name, SEED, UNDECIDED, f"{reason}: add a seed", arm.budget, arm.seeds + 1)
    hold = Decision(arm.name, HOLD, UNDECIDED, f"{reason}: the base gets a seed", arm.budget, arm.seeds)
    if seed_base and can_base:
        stage.base_seed = True
        stage.base_reasons.append(arm.name)
    if seed_arm and can_arm:
        return seed
    if seed_base and can_base:
        return hold
    if can_arm:
        return seed
    if can_base:
        stage.base_seed = True
        stage.base_reasons.append(arm.name)
        return hold
    new = extended_budget(arm, limits)
    floor = _seed_floor(arm, base, stage.seed_sd)
    d = row.delta_A if row is not None else 0.0
    reachable = floor < limits.margin - abs(d) or abs(d) - floor > limits.claim * limits.margin
    if new > arm.budget and not reachable:
        return Decision(
            arm.name, STOP, UNDECIDED,
            f"{reason}; at --max-seeds {limits.max_seeds} the seed-to-seed part of the dA interval "
            f"(+-{floor:.3f}), which a longer run does not narrow, leaves no verdict within reach",
            arm.budget, arm.seeds)
    if new > arm.budget:
        return Decision(arm.name, EXTEND, UNDECIDED, f"{reason}; seeds at --max-seeds {limits.max_seeds}: extend to "
                                                     f"{new} steps", new, arm.seeds)
    return Decision(arm.name, STOP, UNDECIDED, f"{reason}; at --max-seeds {limits.max_seeds} and --max-budget "
                                               f"{limits.max_budget}: nothing left to try", arm.budget, arm.seeds)


def _decide_base(stage: _Stage, out: dict[str, Decision]) -> Decision:
    """The base: stop once every variant has stopped; else extended or seeded when a variant
    asked for it, else held."""
    base, limits = stage.base, stage.limits
    running = [d for d in out.values() if d.action != STOP]
    if not running:
        return Decision(base.name, STOP, "baseline", "every variant is decided or out of options",
                        base.budget, base.seeds)
    if stage.base_extend and extended_budget(base, limits) > base.budget:
        new = extended_budget(base, limits)
        return Decision(base.name, EXTEND, "baseline",
                        f"ceiling of {base.name} not identified: extend to {new} steps", new, base.seeds)
    if stage.base_seed:
        return Decision(base.name, SEED, "baseline",
                        f"its A interval is the wider one against {', '.join(stage.base_reasons)}: add a seed",
                        base.budget, base.seeds + 1)
    return Decision(base.name, HOLD, "baseline", "", base.budget, base.seeds)


@dataclass(frozen=True)
class Need:
    """What a verdict on a variant would need beyond the limits it stopped at.

    budgets: arm name -> optimiser steps per run that reach ``min_reach`` x
    C_mid, for each of the variant and the base whose ceiling is not
    identified (None where it has no fit or no compute rate to say); seeds:
    runs per arm that narrow the dA interval to half the margin (when both
    ceilings are identified), else None; declining: the arms whose pass
    rate falls after a peak (then no budget or seed count is given: the
    sigmoid does not describe them).
    """

    budgets: dict[str, int | None]
    seeds: int | None
    declining: tuple[str, ...] = ()


def needed(arm: Arm, base: Arm, delta_interval: tuple[float, float] | None, limits: Limits) -> Need | None:
    """What a variant left undecided at its limits would need for a verdict.

    * A ceiling not identified (the variant's or the base's): the budget that
      reaches ``limits.min_reach`` x C_mid, min_reach C_mid / compute_per_step
      steps rounded up to ``step_multiple``, with no cap (the rule of
      :func:`extended_budget` without its growth and ``max_budget`` caps).
    * Both identified: the interval of dA, half-width h with n_v and n_b
      seeds, narrows as k sqrt(1/n_v + 1/n_b) (both parts of each arm's
      interval, the fit's and the seed spread, shrink as 1/sqrt(n)); seeds per
      arm n = ceil(2 k^2 / (margin / 2)^2) bring it to half the margin, the
      target of :mod:`scalectl.ablation.power`.

    * A run that declines after a peak (``late_decline``, the variant's or
      the base's): nothing of the above applies; the names are returned.

    Returns None when nothing applies (no interval of dA).
    """
    falling = tuple(a.name for a in (arm, base) if a.fit is not None and a.fit.has_flag(DECLINE))
    if falling:
        return Need({}, None, declining=falling)
    budgets: dict[str, int | None] = {}
    for a in (arm, base):
        if ceiling_identified(a.fit, limits.min_reach):
            continue
        if a.fit is None or not a.compute_per_step or a.compute_per_step <= 0:
            budgets[a.name] = None
        else:
            budgets[a.name] = round_up(limits.min_reach * a.fit.C_mid / a.compute_per_step, limits.step_multiple)
    if budgets:
        return Need(budgets, None)
    if delta_interval is None:
        return None
    lo, hi = delta_interval
    k = (hi - lo) / 2 / math.sqrt(1 / arm.seeds + 1 / base.seeds)
    return Need({}, max(1, math.ceil(2 * k * k / (limits.margin / 2) ** 2 - 1e-9)))


def is_true_verdict(verdict: str, true_delta: float, margin: float) -> bool | None:
    """Whether a verdict matches a true difference of ceilings (simulations).

    True: higher when true_delta >= margin, lower when <= -margin, a tie
    (faster or slower) when |true_delta| < margin.  Returns None for
    "undecided" / "cannot win" (no claim made), False for a wrong claim.
    """
    if verdict == HIGHER:
        return true_delta >= margin
    if verdict == LOWER:
        return true_delta <= -margin
    if verdict in TIES:
        return abs(true_delta) < margin
    return None
