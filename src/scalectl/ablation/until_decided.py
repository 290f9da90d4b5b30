"""``ablate --until-decided`` and ``--plan`` as library calls: spend compute until the verdicts are decided.

:func:`prepare` checks the settings and plans the runs (a :class:`Staged`); then
:func:`power` estimates the budget and seeds that resolve the margin (``--plan``), or
:func:`run` trains stage after stage over the store (:class:`scalectl.ablation.staged.StoreBackend`,
the loop of :func:`scalectl.ablation.adaptive.run_loop`) and writes the report
(``adaptive.md`` and ``adaptive.json``).  Every stage goes to the store's
``ablation_stages`` table as soon as it is decided; the same call again after a
Ctrl-C resumes after the last recorded stage.  Progress goes to a ``log`` callback.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from scalectl.ablation.decisions import Limits
from scalectl.ablation.staged import (
    StoreBackend,
    needs,
    power_plan,
    reopen_undecided,
    state_from_stages,
    summary,
    total_budget_line,
    write_manifest,
)
from scalectl.errors import UserError

#: The keys ``--assume`` may state (fit-axis units for C_mid and compute_per_step; wall-clock
#: seconds for seconds_per_step).
ASSUME_KEYS = ("C_mid", "compute_per_step", "s_fit", "s_seed", "seconds_per_step")
#: The columns of a stage row kept in the ``ablation_stages`` table.
STAGE_KEYS = frozenset({"variant", "is_base", "budget", "seeds", "A", "A_lo", "A_hi", "dA", "dA_lo", "dA_hi",
                        "flags", "action", "verdict", "reason", "next_budget", "next_seeds", "seed_sd",
                        "trained_steps", "fit"})


def _quiet(message: str) -> None:
    pass


@dataclass(frozen=True)
class Staged:
    """An adaptive ablation ready to run.

    plan: the :class:`scalectl.ablation.planner.Plan` with ``repeats = max_seeds``; kind:
    the launcher; limits: the :class:`scalectl.ablation.decisions.Limits` of its decisions;
    initial: the first stage's budget (optimiser steps per run); rate: device-hours per step
    before a run has measured one (None: unknown); db: the store's path; total_budget:
    device-hours the ablation may spend in all (None: no cap); level: the interval level of
    the stage decisions; margin: the :class:`scalectl.science.margin.Margin` of the
    decisions (its value is ``limits.margin``) and where it came from.
    """

    plan: Any
    kind: str
    limits: Limits
    initial: int
    rate: float | None
    db: str
    total_budget: float | None
    level: float
    margin: Any = None


@dataclass(frozen=True)
class Outcome:
    """The end of :func:`run`: the summary of :func:`scalectl.ablation.staged.summary`, why the
    loop ended, what the undecided variants would need, the Markdown report and its path; or,
    after Ctrl-C (``interrupted``), how many jobs were cancelled."""

    summary: dict | None = None
    ended: str | None = None
    needs: tuple[str, ...] = ()
    text: str = ""
    report: Path | None = None
    interrupted: bool = False
    cancelled: int = 0

    def to_dict(self) -> dict:
        """JSON-ready: the summary, ``ended``, ``needs`` and the report's path."""
        return {**(self.summary or {}), "ended": self.ended, "needs": list(self.needs), "report": str(self.report)}


def parse_assume(values: list[str]) -> dict[str, float]:
    """``C_mid=0.1,s_fit=0.004`` (repeatable) -> dict; raises UserError naming the allowed keys,
    or a value that is not finite, not > 0 (``s_seed``: not >= 0)."""
    out_: dict[str, float] = {}
    for v in values:
        for part in filter(None, v.split(",")):
            k, sep, raw = part.partition("=")
            if not sep or k.strip() not in ASSUME_KEYS:
                raise UserError(f"--assume {part!r}: expected KEY=NUMBER with KEY one of: {', '.join(ASSUME_KEYS)}")
            try:
                value = float(raw)
            except ValueError:
                raise UserError(f"--assume {part!r}: {raw!r} is not a number") from None
            low = 0.0 if k.strip() == "s_seed" else None     # a seed-to-seed sd may be 0; the rest are > 0
            if not math.isfinite(value) or (value < low if low is not None else value <= 0):
                raise UserError(f"--assume {part!r}: {k.strip()} must be a finite number "
                                + (">= 0" if low is not None else "> 0"))
            out_[k.strip()] = value
    return out_


def prepare(spec, *, db: str, setup=None, overrides=(), launcher: str | None = None, margin: float | None = None,
            max_budget: int | None = None, max_seeds: int = 6, total_budget: float | None = None,
            race: bool = False, level: float = 0.99, rate: float | None = None) -> Staged:
    """Check the settings of an adaptive ablation of ``spec`` and plan it.

    The first stage's budget is the plan's ``budget.steps``; ``max_budget`` defaults to 8
    times it.  ``rate`` (device-hours per step) defaults to the ablation file's, else a
    simulated base's, else the median measured on completed runs of the store.

    Raises:
        UserError: a bad setting (naming its option and what is allowed), a plan that does
            not load, no step budget, or an unknown launcher.
    """
    from scalectl.ablation.planner import plan as make_plan
    from scalectl.launch.registry import LAUNCHER_TYPES

    if max_seeds < 1:
        raise UserError(f"--max-seeds {max_seeds} must be >= 1")
    if total_budget is not None and total_budget <= 0:
        raise UserError(f"--total-budget {total_budget} must be > 0 device-hours")
    if not 0 < level < 1:
        raise UserError(f"--level {level} must lie strictly between 0 and 1")
    plan = make_plan(spec, setup=setup, overrides=overrides, repeats=max_seeds)
    first = plan.variants[0].recipe
    initial = first.budget.steps
    if initial is None:
        raise UserError("--until-decided needs a step budget per run: give --budget-steps N")
    if max_budget is None:
        max_budget = 8 * initial
    if max_budget < initial:
        raise UserError(f"--max-budget {max_budget} is below the first stage's budget {initial} steps")
    kind = launcher or first.launcher.type
    if kind not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {kind!r} is not one of: {', '.join(LAUNCHER_TYPES)}")
    used = _margin(spec, margin, plan.variants[0].recipe, db)
    limits = Limits(max_budget=max_budget, max_seeds=max_seeds, margin=used.value,
                    step_multiple=first.eval.every_steps, race=race)
    if rate is None:
        rate = _rate(spec, first, db)
    return Staged(plan, kind, limits, initial, rate, db, total_budget, level, used)


def _margin(spec, choice, base, db: str):
    """The margin of the decisions (:func:`scalectl.science.margin.for_ablation`): ``choice``
    (``--margin``), else the spec's; ``auto`` measured from the seeds of the ``base`` recipe in the
    store: its runs at the first budget, and its seeds trained further (an extended base run, as
    the ablation itself extends them) on their points up to that budget."""
    from scalectl.science.fits import FitOptions
    from scalectl.science.margin import for_ablation
    from scalectl.store.journal import open_with_journals

    if not Path(db).exists():
        return for_ablation(None, choice, spec.margin, spec.margin_where, base.content_hash, FitOptions())
    with open_with_journals(db) as store:
        return for_ablation(store, choice, spec.margin, spec.margin_where, base.content_hash, FitOptions(),
                            recipe=base)


def _rate(spec, recipe, db: str) -> float | None:
    """Device-hours per step: the ablation file's, a simulated base's, or measured in the store."""
    from scalectl.curve.simulated import is_simulated, parse_spec

    rate = spec.device_hours_per_step
    if rate is None and is_simulated(recipe.model.path):
        rate = parse_spec(recipe.model.path).hours_per_step
    if rate is None and Path(db).exists():
        from scalectl.ablation.campaign import measured_rate
        from scalectl.store.journal import open_with_journals

        with open_with_journals(db) as store:
            m = measured_rate(store, recipe)
        rate = None if m is None else m[0]
    return rate


def power(staged: Staged, assume: dict[str, float], from_run: str | None = None) -> dict:
    """``--plan``: the budget, seeds, cost and wall-clock that resolve a difference of the margin
    (:func:`scalectl.ablation.staged.power_plan`; ``assume`` as :func:`parse_assume` reads it;
    ``from_run``: a stored run to take the base's curve and rate from, ``--from-run``), the
    margin's source and the seed runs that would measure the user's own (:func:`margin_seeds`)."""
    p = power_plan(staged.db, staged.plan, staged.limits, staged.rate, assume, staged.level, from_run)
    p["margin_source"] = None if staged.margin is None else staged.margin.to_dict()
    p["margin_seeds"] = margin_seeds(staged, p.get("rate"), p["C_mid"], p["compute_per_step"])
    return p


def margin_seeds(staged: Staged, rate: float | None, C_mid: float, compute_per_step: float) -> dict:
    """The seed runs that measure the user's own margin (:mod:`scalectl.science.margin`), at a
    budget that identifies the ceiling: a margin counts only the runs whose fits identify it, so
    runs that stop short of :data:`~scalectl.defaults.IDENTIFY_REACH` x C_mid (the one rule of
    enough data, :func:`scalectl.curve.planning.identifying_steps`) would be left out.

    The budget is the ablation's first one when it reaches the rule (then ``--margin auto``
    measures these runs: one content hash, the base's), else the budget that does, and the
    result says so (``identifies`` False, ``reach`` at the ablation's budget).  Runs of the base
    recipe at that budget are proposed until the store holds
    :data:`~scalectl.science.margin.MIN_RUNS` completed ones: their seeds, the ``scalectl run``
    commands that train them, what each would do with a stored run of the same recipe and seed
    (``scalectl run`` reuses, resumes or extends it: :func:`scalectl.launch.runs.stored_run_for`),
    and their device-hours at ``rate`` (None: unknown), counting only the steps still to train.

    Args:
        C_mid, compute_per_step: the base's, on one compute axis (the power plan's).
    """
    from scalectl.curve.planning import identifying_steps
    from scalectl.defaults import IDENTIFY_REACH
    from scalectl.launch.runs import EXTEND, RESUME, stored_run_for
    from scalectl.recipe.schema import Recipe
    from scalectl.science.margin import MIN_RUNS, seed_groups, trained_further
    from scalectl.store.journal import open_with_journals

    plan = staged.plan
    base = plan.variants[0].recipe
    first = base.budget.steps
    needed = identifying_steps(C_mid, compute_per_step, staged.limits.step_multiple)
    enough = first is not None and first >= needed
    budget = first if enough else needed

    def at(seed: int) -> Recipe:
        data = base.to_dict()
        data.update(seed=seed, budget=dict(data["budget"], steps=budget))
        return Recipe.model_validate(data)

    digest = at(base.seed).content_hash
    have: list[dict] = []
    standing: dict[int, tuple[str, str, int]] = {}
    store_there = Path(staged.db).exists()
    with open_with_journals(staged.db) if store_there else contextlib.nullcontext() as store:
        if store is not None:       # its runs at that budget, and its seeds trained further (extended)
            have = seed_groups(store).get(digest, [])
            have += trained_further(store, at(base.seed), have)
        taken = {r.get("seed") for r in have}
        seeds = [s for s in range(base.seed, base.seed + MIN_RUNS + len(have)) if s not in taken]
        seeds = seeds[:MIN_RUNS - len(have)]
        for s in seeds:
            found = stored_run_for(store, at(s)) if store is not None else None
            if found is not None and found[0] in (RESUME, EXTEND):
                standing[s] = (found[0], found[1]["name"], found[2])
    steps = sum(budget - standing.get(s, ("", "", 0))[2] for s in seeds)
    sets = "".join(f" --set {o}" for o in plan.spec.overrides if not o.replace(" ", "").startswith("budget.steps="))
    source = plan.spec.base or plan.variants[0].name
    return {"recipe_hash": digest, "budget_steps": budget, "have": [r["name"] for r in have],
            "more": len(seeds), "seeds": seeds, "steps": steps,
            "device_hours": None if rate is None else steps * rate,
            "identifies": enough, "ablation_budget_steps": first, "rule_reach": IDENTIFY_REACH,
            "reach": None if first is None else first * compute_per_step / C_mid,
            "stored": {s: {"action": a, "run": n, "steps": k} for s, (a, n, k) in standing.items()},
            "commands": [f"scalectl run {source} --setup {plan.setup}{sets} --set budget.steps={budget} --seed {s}"
                         for s in seeds]}


def run(staged: Staged, *, runs_dir: str | Path = "runs", out_dir: str | Path | None = None, bootstrap: int = 1000,
        poll: float = 2.0, log: Callable[[str], None] = _quiet) -> Outcome:
    """Train stage after stage until every verdict is decided or nothing is left to try
    within the limits (or ``total_budget`` would be passed), then write ``adaptive.md`` and
    ``adaptive.json`` into ``out_dir`` (default ``reports/NAME``).

    Resumes after the last stage the store records for this ablation (reopening variants
    stopped undecided that the limits now given leave something to try).  Ctrl-C
    (KeyboardInterrupt) cancels the jobs of the stage (each saves a checkpoint) and returns
    with ``interrupted``.  ``log``: a line per stage, per run change and per decision.

    Raises:
        UserError: runs that did not complete, or recorded stages that name other variants.
    """
    from scalectl.ablation.adaptive import run_loop
    from scalectl.store.journal import open_with_journals

    plan, limits, db = staged.plan, staged.limits, staged.db
    name = plan.spec.name
    out_dir = Path(out_dir or Path("reports") / name)
    backend = StoreBackend(db, plan, staged.kind, runs_dir, staged.rate, poll_s=poll, log=log)
    state = _resume_state(staged, backend, log)
    section = plan.variants[0].recipe.fit
    fit_kw = {"bootstrap": bootstrap, "level": staged.level, "axis": section.axis,
              "min_compute": float(section.min_compute or 0.0), "r0": section.r0}

    def record(stage) -> None:
        with open_with_journals(db) as store:
            store.add_stage(name, stage.stage, [{k: v for k, v in r.items() if k in STAGE_KEYS} for r in stage.rows],
                            backend.spent_hours())
        for r in stage.rows:
            log(stage_line(stage.stage, r))

    write_manifest(db, plan, runs_dir, backend)
    try:
        result = run_loop(backend, state, limits, total_budget=staged.total_budget, fit_kw=fit_kw, record=record,
                          on_stage=log)
    except KeyboardInterrupt:
        log("interrupted: cancelling the ablation's jobs (each saves a checkpoint)")
        return Outcome(interrupted=True, cancelled=backend.cancel_all())
    write_manifest(db, plan, runs_dir, backend)
    return _report(staged, backend, result, out_dir)


def _resume_state(staged: Staged, backend: StoreBackend, log: Callable[[str], None]):
    """The loop state after the stages recorded in the store (a fresh stage 0 without any),
    with the steps each run has trained and the device-hours spent."""
    from scalectl.store.journal import open_with_journals

    plan, limits = staged.plan, staged.limits
    with open_with_journals(staged.db, create=True) as store:
        rows = store.stages(plan.spec.name)
    state = state_from_stages(rows, plan.baseline, [v.name for v in plan.variants], staged.initial)
    reopened = reopen_undecided(rows, state, limits)
    if reopened:
        log(f"reopening {', '.join(reopened)}: stopped undecided, with something left to try under "
            f"--max-budget {limits.max_budget} --max-seeds {limits.max_seeds}")
    for n, a in state.arms.items():
        a.trained = backend.trained(n)
    state.spent_hours = backend.spent_hours()
    if rows:
        log(f"resuming adaptive ablation {plan.spec.name} at stage {state.stage} "
            f"({state.spent_hours:.4g} device-hours spent so far)")
    return state


def _report(staged: Staged, backend: StoreBackend, result, out_dir: Path) -> Outcome:
    """Summarise the recorded stages, say what the undecided variants need, write the report."""
    from scalectl.store.journal import open_with_journals

    plan, limits = staged.plan, staged.limits
    with open_with_journals(staged.db) as store:
        rows = store.stages(plan.spec.name)
    hps = {v.name: backend.hours_per_step(v.name) for v in plan.variants}
    s = summary(rows, hps, backend.spent_hours(), limits.margin)
    if staged.margin is not None:
        s["margin_source"] = staged.margin.to_dict()
    wanted = needs(rows, result.state, backend, limits)
    if result.ended == "total budget":
        wanted.insert(0, total_budget_line(result.state, backend, staged.total_budget))
    text = markdown(s, plan.spec.name, result.ended, wanted)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "adaptive.md").write_text(text)
    (out_dir / "adaptive.json").write_text(json.dumps({**s, "ended": result.ended, "needs": wanted}, indent=2))
    return Outcome(s, result.ended, tuple(wanted), text, out_dir / "adaptive.md")


def stage_line(stage: int, r: dict) -> str:
    """One variant's decision at a stage: budget x seeds, dA with its interval, action (verdict): reason."""
    d = "" if r["dA"] is None else f" dA {r['dA']:+.3f} [{r['dA_lo']:+.3f}, {r['dA_hi']:+.3f}]"
    return (f"stage {stage} {r['variant']}: {r['budget']} steps x{r['seeds']}{d} -> {r['action']}"
            f" ({r['verdict']}){': ' + r['reason'] if r['reason'] else ''}")


def _step_text(h: dict) -> str:
    a = "-" if h["A"] is None else f"A {h['A']:.3f}"
    d = "" if h["dA"] is None else f" dA {h['dA']:+.3f} [{h['dA_lo']:+.3f}, {h['dA_hi']:+.3f}]"
    return f"{h['budget']}x{h['seeds']} ({a}{d}) {h['action']}"


def markdown(s: dict, name: str, ended: str, needs: list[str]) -> str:
    """The adaptive report as Markdown: each variant's path through the stages and its
    verdict, the device-hours spent against a fixed design's, and what the variants
    without a verdict would need (``s``: :func:`scalectl.ablation.staged.summary`)."""
    where = s.get("margin_source", {}).get("where")
    lines = [f"# {name}: adaptive ablation", "",
             f"{s['stages']} stage(s), ended: {ended}. Budgets are optimiser steps per run x seeds. "
             f"Margin on A: {s['margin']:.3g}" + (f" ({where})." if where else "."), "",
             "| variant | path (stage: budget x seeds, A, dA, action) | verdict |", "|---|---|---|"]
    for v in s["variants"]:
        path = " -> ".join(f"{h['stage']}: {_step_text(h)}" for h in v["path"])
        lines.append(f"| {v['variant']} | {path} | {'baseline' if v['is_base'] else v['verdict']} |")
    lines.append("")
    for v in s["variants"]:
        if not v["is_base"]:
            lines.append(f"- {v['variant']}: {v['verdict']}" + (f": {v['reason']}" if v["reason"] else ""))
    lines.append("")
    fd = s["fixed_design"]
    share = "" if s["saved_share"] is None else f" ({s['saved_share']:.0%} saved)"
    lines.append(f"Spent {s['spent_hours']:.4g} device-hours; training every variant to the largest budget used "
                 f"({fd['budget']} steps x {fd['seeds']} seeds) would have spent {s['fixed_hours']:.4g}{share}.")
    if needs:
        lines += ["", "What the variants without a verdict would need:"]
    for n in needs:
        lines.append(f"- {n}")
    return "\n".join(lines) + "\n"
