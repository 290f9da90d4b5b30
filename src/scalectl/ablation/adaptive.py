"""The decision loop of an adaptive ablation: train, fit, compare, decide, until decided.

Stage 0 trains every arm (the base and each variant) to an initial budget with
one seed (or ``initial_seeds``).  After each stage every running arm's seeds are
pooled and fitted, the A intervals are widened by the seed-to-seed spread,
every variant is compared with the base (:func:`scalectl.science.compare.compare`),
and :func:`scalectl.ablation.decisions.decide` says per arm: stop, extend, add a seed,
or hold.  The loop ends when nothing runs any more or the next stage would
pass ``total_budget`` (device-hours).

Where the runs come from is a :class:`Backend`: :class:`SimBackend` draws
points in-process (many variants in seconds, and the fixed-budget comparison),
:class:`scalectl.ablation.staged.StoreBackend` trains real or simulated runs
through the launcher and the store.  Each stage is handed to ``record`` (the
``ablation_stages`` table for the command), and a loop can start from a
recorded state (:class:`LoopState`), so an interrupted ablation resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from scalectl.ablation.decisions import (
    DECIDED, EXTEND, HOLD, SEED, STOP, Arm, Decision, Limits, decide, pooled_seed_sd, widen_for_seeds,
)


class Backend(Protocol):
    """Where an adaptive ablation's runs are trained and read back."""

    def ensure(self, targets: Mapping[str, tuple[int, int]]) -> None:
        """Train so that arm -> (budget, seeds) holds: ``seeds`` runs, each to ``budget`` steps."""

    def curves(self, name: str, budget: int, seeds: int) -> list[tuple[Sequence[float], Sequence[float]]]:
        """Per seed: (compute on the fit axis, pass rate) of the arm's runs at that budget."""

    def hours_per_step(self, name: str) -> float:
        """Device-hours per optimiser step of the arm's runs (the estimate of a stage's cost)."""

    # Optional: ``spent_hours() -> float``, the device-hours the runs have measured so far.
    # After each stage the loop takes it as what was spent (a real run's rate per step
    # drifts with the machine's load and the completions' length), else it adds the estimate.


@dataclass
class ArmState:
    """An arm between stages: its budget and seeds, and the verdict it was stopped with."""

    name: str
    budget: int
    seeds: int
    is_base: bool = False
    stopped: str | None = None
    trained: dict[int, int] = field(default_factory=dict)   # seed index -> steps trained

    def steps(self) -> int:
        return sum(self.trained.values())


@dataclass
class LoopState:
    """Where a loop stands: the next stage's index and every arm's state."""

    stage: int
    arms: dict[str, ArmState]
    spent_hours: float = 0.0


@dataclass(frozen=True)
class StageRecord:
    """One stage: index, per arm its fit summary and decision, device-hours spent so far."""

    stage: int
    rows: tuple[dict, ...]
    spent_hours: float


@dataclass(frozen=True)
class LoopResult:
    """The end of a loop: per arm its last decision, every stage, the device-hours spent, why it ended."""

    decisions: dict[str, Decision]
    stages: tuple[StageRecord, ...]
    spent_hours: float
    ended: str
    state: LoopState


def initial_state(names: Sequence[str], baseline: str, budget: int, seeds: int = 1) -> LoopState:
    """Stage 0: every arm at ``budget`` steps with ``seeds`` seeds."""
    return LoopState(0, {n: ArmState(n, budget, seeds, is_base=(n == baseline)) for n in names})


def stage_cost(state: LoopState, backend: Backend) -> float:
    """Device-hours the next stage adds: for each running arm, the steps its
    runs still need to reach (budget, seeds), times its hours per step."""
    total = 0.0
    for a in state.arms.values():
        if a.stopped is not None:
            continue
        need = sum(max(0, a.budget - a.trained.get(s, 0)) for s in range(a.seeds))
        total += need * backend.hours_per_step(a.name)
    return total


def fit_arm(curves, fit_kw: Mapping) -> tuple:
    """Pooled fit of an arm's seeds, and the A of each seed fitted alone (several seeds only).

    curves: per seed (compute (n_s,), pass rate (n_s,)).  Returns (fit of the
    pooled points, list of per-seed A, pooled compute (n,), pooled pass rate
    (n,)).  Raises :class:`scalectl.curve.FitError` when the pooled points
    cannot be fitted; a seed that cannot be fitted alone is left out of the list.
    """
    import numpy as np

    from scalectl.curve import FitError, fit_sigmoid

    xs = np.concatenate([np.asarray(c[0], float) for c in curves])
    ys = np.concatenate([np.asarray(c[1], float) for c in curves])
    fit = fit_sigmoid(xs, ys, **fit_kw)
    per_seed = []
    if len(curves) > 1:
        kw = dict(fit_kw, bootstrap=0)
        for x, y in curves:
            try:
                per_seed.append(fit_sigmoid(x, y, **kw).A)
            except FitError:
                pass
    return fit, per_seed, xs, ys


def run_loop(backend: Backend, state: LoopState, limits: Limits, *, total_budget: float | None = None,
             fit_kw: Mapping | None = None, record: Callable[[StageRecord], None] | None = None,
             max_stages: int = 50, on_stage: Callable[[str], None] | None = None) -> LoopResult:
    """Run stages until every arm stops, ``total_budget`` (device-hours) would be
    passed, or ``max_stages`` stages ran.

    fit_kw: keyword arguments of :func:`scalectl.curve.fit_sigmoid` (bootstrap,
    axis, min_compute, seed).  record: called with each stage as soon as it is
    decided (before the next stage trains).  on_stage: a line saying what each
    stage trains.  Returns a :class:`LoopResult`;
    ``ended`` is "decided" (every variant stopped with a verdict), "out of
    options" (some stopped undecided: nothing left within the limits), "total
    budget" or "max stages".

    A stage: train the running arms to their (budget, seeds) (:func:`_train`), fit them
    (:func:`_fit_stage`) and widen their A intervals by the pooled seed spread
    (:func:`_stage_arms`), compare the variants with the base, decide
    (:func:`scalectl.ablation.decisions.decide`), record the stage (:func:`_stage_rows`)
    and apply the decisions (:func:`_apply`).
    """
    from scalectl.science.compare import compare

    fit_kw = dict(fit_kw or {})
    fit_kw.setdefault("bootstrap", 200)
    stages: list[StageRecord] = []
    decisions: dict[str, Decision] = {}
    base_name = next(a.name for a in state.arms.values() if a.is_base)
    ended = "max stages"
    for _ in range(max_stages):
        variants = [a for a in state.arms.values() if not a.is_base]
        if all(a.stopped is not None for a in variants):
            # a loop started again after every variant stopped: some may have stopped undecided
            ended = "decided" if all(a.stopped in DECIDED for a in variants) else "out of options"
            break
        cost = stage_cost(state, backend)
        if total_budget is not None and state.spent_hours + cost > total_budget + 1e-12:
            ended = "total budget"
            break
        targets = _train(state, backend, cost, on_stage or (lambda _m: None))
        fits, errors, per_seed, curves = _fit_stage(backend, targets, fit_kw)
        sd, _df = pooled_seed_sd(per_seed, limits.seed_sd, limits.prior_df)
        arms, runcurves = _stage_arms(state, backend, fits, errors, curves, sd)
        comparison = None
        if base_name in runcurves:
            comparison = compare(runcurves, baseline=base_name, margin=limits.margin)
        decisions = decide(arms, comparison, limits, seed_sd=sd)
        rec = StageRecord(state.stage, _stage_rows(arms, decisions, comparison, runcurves, state, sd),
                          state.spent_hours)
        stages.append(rec)
        if record is not None:
            record(rec)
        done = _apply(state, decisions)
        if done is not None:
            ended = done
            break
    return LoopResult(decisions, tuple(stages), state.spent_hours, ended, state)


def _train(state: LoopState, backend: Backend, cost: float, say: Callable[[str], None]) -> dict[str, tuple[int, int]]:
    """Train every running arm to its (budget, seeds); record the steps trained and the
    device-hours spent (measured by the backend when it can, else ``cost``, the estimate).
    Returns arm -> (budget, seeds) of the running arms."""
    targets = {a.name: (a.budget, a.seeds) for a in state.arms.values() if a.stopped is None}
    to_train = [n for n, (b, s) in targets.items()
                if any(state.arms[n].trained.get(i, 0) < b for i in range(s))]
    say(f"stage {state.stage}: " + ("training " if to_train else "nothing to train, deciding again on ")
        + ", ".join(f"{n} {b} steps x{s}" for n, (b, s) in targets.items()))
    backend.ensure(targets)
    for n, (b, s) in targets.items():
        arm = state.arms[n]
        for i in range(s):
            arm.trained[i] = max(arm.trained.get(i, 0), b)
    measured = getattr(backend, "spent_hours", None)
    state.spent_hours = measured() if callable(measured) else state.spent_hours + cost
    return targets


def _fit_stage(backend: Backend, targets: Mapping[str, tuple[int, int]], fit_kw: Mapping):
    """Fit each running arm's pooled seeds (:func:`fit_arm`): (fits, errors, per-seed A,
    pooled (compute, pass rate)), each by arm; an arm that cannot be fitted is in ``errors``."""
    from scalectl.curve import FitError

    fits, errors, per_seed, curves = {}, {}, {}, {}
    for n, (b, s) in targets.items():
        try:
            fit, seedA, xs, ys = fit_arm(backend.curves(n, b, s), fit_kw)
            fits[n], per_seed[n], curves[n] = fit, seedA, (xs, ys)
        except (FitError, ValueError) as exc:
            errors[n] = str(exc)
    return fits, errors, per_seed, curves


def _stage_arms(state: LoopState, backend: Backend, fits: dict, errors: dict, curves: dict, sd: float):
    """Every arm as :func:`scalectl.ablation.decisions.decide` reads it, its A interval widened
    to the seed spread ``sd`` (:func:`widen_for_seeds`), and the curves of the fitted ones to
    compare: (arms, name -> :class:`scalectl.science.compare.RunCurve`)."""
    from scalectl.science.compare import RunCurve

    arms: list[Arm] = []
    runcurves = {}
    for n, a in state.arms.items():
        if a.stopped is not None:
            arms.append(Arm(n, a.budget, a.seeds, None, None, a.is_base, a.stopped))
            continue
        fit = fits.get(n)
        wide = None if fit is None else widen_for_seeds(fit, a.seeds, sd)
        cps = backend.hours_per_step(n) if fit is None or fit.axis == "gpu_hours" else None
        if fit is not None and cps is None:
            xs = curves[n][0]
            cps = float(max(xs)) / a.budget if a.budget else None
        arms.append(Arm(n, a.budget, a.seeds, wide, cps, a.is_base, None, errors.get(n)))
        if wide is not None:
            runcurves[n] = RunCurve(curves[n][0], curves[n][1], wide)
    return arms, runcurves


def _stage_rows(arms: list[Arm], decisions: dict[str, Decision], comparison, runcurves: dict,
                state: LoopState, sd: float) -> tuple[dict, ...]:
    """One row per arm of a stage: its fit (A with its interval, flags), dA with its interval,
    the decision and the next (budget, seeds), the seed sd, the steps trained, the fit itself."""
    rows = []
    for arm in arms:
        d = decisions[arm.name]
        row = None
        if comparison is not None and arm.name in runcurves:
            row = comparison.row(arm.name)
        iv = arm.fit.interval("A") if arm.fit is not None else None
        rows.append({
            "variant": arm.name, "is_base": arm.is_base, "budget": arm.budget, "seeds": arm.seeds,
            "A": None if arm.fit is None else arm.fit.A, "A_lo": None if iv is None else iv[0],
            "A_hi": None if iv is None else iv[1],
            "dA": None if row is None or arm.is_base else row.delta_A,
            "dA_lo": None if row is None or arm.is_base else row.delta_A_interval[0],
            "dA_hi": None if row is None or arm.is_base else row.delta_A_interval[1],
            "flags": [] if arm.fit is None else list(arm.fit.flag_codes),
            "action": d.action, "verdict": d.verdict, "reason": d.reason or (arm.error or ""),
            "next_budget": d.budget, "next_seeds": d.seeds, "seed_sd": sd,
            "fit": None if arm.fit is None else arm.fit.to_dict(),
            "trained_steps": state.arms[arm.name].steps(),
        })
    return tuple(rows)


def _apply(state: LoopState, decisions: dict[str, Decision]) -> str | None:
    """Apply a stage's decisions to the state (stopped variants keep their verdict) and move
    to the next stage.  When nothing is extended or seeded any more, the holding variants stop
    undecided and the loop ends: "decided" or "out of options" is returned (else None)."""
    for n, d in decisions.items():
        a = state.arms[n]
        if d.action == STOP and not a.is_base:
            a.stopped = d.verdict
        a.budget, a.seeds = d.budget, d.seeds
    state.stage += 1
    if any(d.action in (EXTEND, SEED) for d in decisions.values()):
        return None
    for n, d in decisions.items():     # nothing changes any more: holding arms stop undecided
        if d.action == HOLD and not state.arms[n].is_base:
            state.arms[n].stopped = d.verdict
    return "decided" if all(state.arms[n].stopped in DECIDED for n in decisions
                            if not state.arms[n].is_base) else "out of options"


# --------------------------------------------------------------------------- in-process simulation


class SimBackend:
    """Arms with simulated curves (:class:`scalectl.curve.simulated.SimCurve`), points drawn in-process.

    curves: arm -> curve; every: evaluation interval in steps; seed0: the
    first seed (arm seeds are seed0, seed0 + 1, ...).  The fit axis is gpu_hours.
    """

    def __init__(self, curves: Mapping[str, object], every: int = 10, seed0: int = 0):
        self.sim = dict(curves)
        self.every = every
        self.seed0 = seed0

    def ensure(self, targets) -> None:
        """Nothing to train: points are drawn when read."""

    def curves(self, name, budget, seeds):
        from scalectl.curve.simulated import draw_points, eval_steps

        out = []
        for s in range(seeds):
            pts = draw_points(self.sim[name], self.seed0 + s, eval_steps(budget, self.every))
            out.append(([p["gpu_hours"] for p in pts], [p["pass_rate"] for p in pts]))
        return out

    def hours_per_step(self, name) -> float:
        return self.sim[name].hours_per_step


def fixed_design(backend: Backend, names: Sequence[str], baseline: str, budget: int, seeds: int,
                 limits: Limits | None = None, fit_kw: Mapping | None = None) -> tuple[dict[str, str], float]:
    """The verdicts of a fixed-budget ablation: every arm to ``budget`` steps
    with ``seeds`` seeds, judged once with the same intervals (seed spread
    included) and rules as the adaptive loop (``limits``, its budget and seed
    caps replaced).  Returns (variant -> verdict, device-hours)."""
    from dataclasses import replace as _replace

    limits = _replace(limits or Limits(max_budget=budget), max_budget=budget, max_seeds=seeds)
    state = initial_state(names, baseline, budget, seeds)
    result = run_loop(backend, state, limits, fit_kw=fit_kw, max_stages=1)
    verdicts = {n: d.verdict for n, d in result.decisions.items() if n != baseline}
    return verdicts, result.spent_hours
