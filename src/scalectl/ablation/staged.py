"""Staged ablations (``ablate --until-decided``, ``--plan``) against the store: the runs, their stages, the power plan.

The decision loop (:mod:`scalectl.ablation.adaptive`, rules in :mod:`scalectl.ablation.decisions`)
runs over a :class:`StoreBackend`: the runs of the ablation are created,
extended (the same run resumed with a larger ``budget.steps``), seeded (a new
run at the next seed) and launched through the launcher like every other run
(:func:`scalectl.launch.runs.submit`), and their points are read back from the
store.  Every stage goes to the store's ``ablation_stages`` table as soon as
it is decided.  Runs are named ``<ablation>--<variant>--s<seed>``.  Nothing
here prints; :mod:`scalectl.ablation.until_decided` runs it, and the command prints.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from scalectl.defaults import IDENTIFY_REACH
from scalectl.errors import UserError
from scalectl.store.journal import open_with_journals


class StoreBackend:
    """An adaptive ablation's runs, trained by a launcher and read from the store.

    plan: the :class:`scalectl.ablation.Plan` made with ``repeats = max_seeds``
    (it holds each variant's recipe at every seed); kind: launcher type;
    rate: device-hours per step used before a run has measured one.

    The run of a variant's i-th seed is the run named ``<ablation>--<variant>--s<seed>`` when
    the store holds one; else a stored run of the same recipe and seed, whatever its name and
    budget (:func:`scalectl.launch.runs.same_training`: the one that trained the most steps),
    which is reused as far as it goes and extended beyond (a line says so); else a new run of
    that name.
    """

    def __init__(self, db: str, plan, kind: str, runs_dir: Path, rate: float | None, poll_s: float = 1.0,
                 log=lambda message: None):
        self.log = log
        self.db, self.plan, self.kind, self.runs_dir = db, plan, kind, Path(runs_dir)
        self.rate, self.poll_s = rate, poll_s
        self.seed0 = plan.variants[0].seeds[0]
        self.launched: list[int] = []
        self._ids: dict[tuple[str, int], int] = {}        # (variant, seed index) -> the run standing for it

    # ---------------------------------------------------------------- names and recipes
    def run_name(self, variant: str, i: int) -> str:
        from scalectl.ablation import run_name

        return run_name(self.plan.spec.name, variant, self.seed0 + i)

    def recipe(self, variant: str, i: int, budget: int):
        """The variant's recipe at its i-th seed with ``budget.steps = budget``."""
        from scalectl.recipe.schema import Recipe

        runs = [r for r in self.plan.runs if r.variant == variant]
        if i >= len(runs):
            raise UserError(f"variant {variant}: seed index {i} is past --max-seeds {len(runs)}")
        data = runs[i].recipe.to_dict()
        data["budget"] = dict(data["budget"], steps=budget, gpu_hours=None)
        return Recipe.model_validate(data)

    def _row(self, store, variant: str, i: int) -> dict | None:
        """The stored run standing for the variant's i-th seed (class docstring), or None."""
        held = self._ids.get((variant, i))
        if held is not None:
            try:
                return store.get_run(held)
            except UserError:                       # removed meanwhile: look again
                del self._ids[(variant, i)]
        name = self.run_name(variant, i)
        found = [r for r in store.find_runs(name_prefix=name) if r["name"] == name]
        row = found[0] if found else self._same_training(store, variant, i)
        if row is not None:
            self._ids[(variant, i)] = row["id"]
        return row

    def _same_training(self, store, variant: str, i: int) -> dict | None:
        """A stored run of another name that trains the variant's recipe at its i-th seed, whatever
        its budget (:func:`scalectl.launch.runs.same_training`), said in a line; None when none."""
        from scalectl.launch.runs import has_job_file, same_training

        runs = [r for r in self.plan.runs if r.variant == variant]
        if i >= len(runs):
            return None
        found = [(r, n) for r, n in same_training(store, runs[i].recipe) if has_job_file(r)]
        if not found:                   # (an imported run has no folder to extend it from)
            return None
        row, steps = found[0]
        self.log(f"{variant} seed {runs[i].seed}: run {row['name']} of the store trains the same recipe and seed "
                 f"({row['status']}, {steps} steps trained): the ablation uses it, reused as far as it goes "
                 "and extended beyond, instead of training "
                 f"{self.run_name(variant, i)} from step 0")
        return row

    # ---------------------------------------------------------------- the Backend protocol
    def ensure(self, targets) -> None:
        """Create, extend or resume the runs so that each variant has (budget, seeds); wait for them."""
        from scalectl.job.body import write_job_file
        from scalectl.launch.base import ACTIVE, RunSpec
        from scalectl.launch.runs import create_run, submit

        from scalectl.launch.registry import refresh

        with open_with_journals(self.db) as store:       # jobs still alive (an earlier command's, another's)
            alive = [row["id"] for variant, (_, seeds) in targets.items() for i in range(seeds)
                     if (row := self._row(store, variant, i)) is not None and row["status"] in ACTIVE - {"created"}
                     and refresh(store, row)["status"] in ACTIVE - {"created"}]
        if alive:                                        # first wait for them, then extend or resume what fell short
            self._wait(alive, strict=False)
        specs, ids = [], []
        with open_with_journals(self.db) as store:
            for variant, (budget, seeds) in targets.items():
                for i in range(seeds):
                    row = self._row(store, variant, i)
                    if row is None:
                        recipe = self.recipe(variant, i, budget)
                        run_id, run_dir = create_run(store, recipe, self.run_name(variant, i), self.runs_dir,
                                                     launcher=self.kind)
                        specs.append(RunSpec(run_id, self.run_name(variant, i), run_dir, recipe))
                        ids.append(run_id)
                        continue
                    ids.append(row["id"])
                    had = (row.get("recipe") or {}).get("budget", {}).get("steps") or 0
                    pts = store.points(row["id"])
                    done = pts[-1]["step"] if pts else 0
                    if row["status"] in ACTIVE and row["status"] != "created":
                        continue        # started meanwhile by another command: wait for it
                    if row["status"] == "completed" and had >= budget and done >= budget:
                        continue
                    recipe = (self.recipe(variant, i, max(budget, had)) if row["name"] == self.run_name(variant, i)
                              else _with_steps(row["recipe"], max(budget, had)))   # another's run: its own recipe
                    if recipe.to_dict() != row["recipe"]:      # extended: the same run, a larger budget
                        write_job_file(Path(row["run_dir"]), db=store.path, run_id=row["id"],
                                       recipe=recipe.to_dict())
                        store.update_run(row["id"], recipe=json.dumps(recipe.to_dict(), sort_keys=True),
                                         recipe_hash=recipe.content_hash)
                        if recipe.budget.steps != had:
                            self.log(f"  {row['name']}: extended from {had} to {recipe.budget.steps} steps "
                                     f"({done} trained)")
                    specs.append(RunSpec(row["id"], row["name"], Path(row["run_dir"]), recipe))   # the job resumes
            if specs:
                submit(store, specs, self.kind, array=True, job_name=self.plan.spec.name)
        self.launched = ids
        self._wait(ids)

    def run_names(self) -> dict[str, str]:
        """Planned run name -> the name of the stored run standing for it (those that exist)."""
        names = {}
        with open_with_journals(self.db) as store:
            for v in self.plan.variants:
                for i in range(len(v.seeds)):
                    row = self._row(store, v.name, i)
                    if row is not None:
                        names[self.run_name(v.name, i)] = row["name"]
        return names

    def _wait(self, ids: list[int], strict: bool = True) -> None:
        """Until no run in ``ids`` is alive; with ``strict``, raises UserError naming a run that did
        not complete."""
        from scalectl.launch.base import ACTIVE
        from scalectl.launch.registry import refresh

        seen: dict[int, tuple] = {}
        while True:
            alive, failed = 0, []
            with open_with_journals(self.db) as store:
                for run_id in ids:
                    info = store.get_run(run_id)
                    if info["status"] in ACTIVE:
                        info = refresh(store, info)
                    pts = store.points(run_id)
                    key = (info["status"], pts[-1]["step"] if pts else None)
                    if seen.get(run_id) != key:
                        seen[run_id] = key
                        at = "no point yet" if key[1] is None else f"evaluated at step {key[1]}"
                        self.log(f"  {info['name']}: {key[0]}, {at}")
                    if info["status"] in ACTIVE:
                        alive += 1
                    elif info["status"] != "completed":
                        failed.append(f"{info['name']} ended {info['status']}: {info.get('error') or ''}")
            if not alive:
                if failed and strict:
                    raise UserError("runs of the adaptive ablation did not complete:\n  " + "\n  ".join(failed))
                return
            time.sleep(self.poll_s)

    def curves(self, variant: str, budget: int, seeds: int):
        """Per seed: (compute on the variant's fit axis, pass rate), points up to ``budget`` steps."""
        axis = self.plan.variant(variant).recipe.fit.axis
        out_ = []
        with open_with_journals(self.db) as store:
            for i in range(seeds):
                row = self._row(store, variant, i)
                pts = [p for p in store.points(row["id"]) if p["step"] <= budget
                       and p.get(axis) is not None and p.get("pass_rate") is not None]
                out_.append(([float(p[axis]) for p in pts], [float(p["pass_rate"]) for p in pts]))
        return out_

    def hours_per_step(self, variant: str) -> float:
        """Measured on the variant's runs (last GPU-hours / last step), else the plan's rate, else 0."""
        with open_with_journals(self.db) as store:
            rates = []
            for i in range(len(self.plan.variant(variant).seeds)):
                row = self._row(store, variant, i)
                pts = store.points(row["id"]) if row else []
                if pts and pts[-1].get("gpu_hours") and pts[-1]["step"]:
                    rates.append(pts[-1]["gpu_hours"] / pts[-1]["step"])
        if rates:
            return sum(rates) / len(rates)
        return self.rate or 0.0

    def trained(self, variant: str) -> dict[int, int]:
        """Seed index -> steps trained, for the variant's existing runs."""
        out_ = {}
        with open_with_journals(self.db) as store:
            for i in range(len(self.plan.variant(variant).seeds)):
                row = self._row(store, variant, i)
                if row is not None:
                    pts = store.points(row["id"])
                    out_[i] = pts[-1]["step"] if pts else 0
        return out_

    def spent_hours(self) -> float:
        """Device-hours spent by the ablation's runs: the last point's GPU-hours of each."""
        total = 0.0
        with open_with_journals(self.db) as store:
            for v in self.plan.variants:
                for i in range(len(v.seeds)):
                    row = self._row(store, v.name, i)
                    pts = store.points(row["id"]) if row else []
                    if pts and pts[-1].get("gpu_hours"):
                        total += pts[-1]["gpu_hours"]
        return total

    def cancel_all(self) -> int:
        """Cancel the live jobs of the runs launched last (each checkpoints); returns how many."""
        from scalectl.ablation.campaign import cancel_all

        with open_with_journals(self.db) as store:
            return cancel_all(store, dict(enumerate(self.launched)))


def _with_steps(data: dict, steps: int):
    """A stored run's recipe (a dict) with ``budget.steps = steps`` and no GPU-hour limit."""
    from scalectl.recipe.schema import Recipe

    return Recipe.model_validate(dict(data, budget=dict(data["budget"], steps=steps, gpu_hours=None)))


# --------------------------------------------------------------------------- state from the stages table


def state_from_stages(rows: list[dict], baseline: str, names: list[str], initial: int):
    """The loop state after the last recorded stage (a fresh stage 0 without rows)."""
    from scalectl.ablation.adaptive import ArmState, LoopState, initial_state
    from scalectl.ablation.decisions import STOP

    if not rows:
        return initial_state(names, baseline, initial)
    last = max(r["stage"] for r in rows)
    latest = {r["variant"]: r for r in rows if r["stage"] == last}
    arms = {}
    for n in names:
        r = latest.get(n)
        if r is None:
            raise UserError(f"the stages recorded for this ablation do not name variant {n!r}: "
                            "its variants changed; give it a new --name")
        stopped = r["verdict"] if r["action"] == STOP and not r["is_base"] else None
        arms[n] = ArmState(n, r["next_budget"], r["next_seeds"], is_base=(n == baseline), stopped=stopped)
    return LoopState(last + 1, arms)


def _stopped_pair(rows: list[dict], variant: str):
    """(variant Arm, base Arm, variant row) at the stage where ``variant`` stopped, rebuilt
    from the stored rows (fits as stored, compute per step = the fit's last compute / the
    budget); None when that stage has no base row."""
    from scalectl.ablation.decisions import Arm
    from scalectl.curve import SigmoidFit

    last = paths(rows)[variant][-1]
    base_row = next((r for r in rows if r["is_base"] and r["stage"] == last["stage"]), None)
    if base_row is None:
        return None
    arms = []
    for r in (last, base_row):
        fit = SigmoidFit.from_dict(r["fit"]) if r.get("fit") else None
        cps = fit.window[1] / r["budget"] if fit is not None and r["budget"] else None
        arms.append(Arm(r["variant"], r["budget"], r["seeds"], fit, cps, r["is_base"]))
    return arms[0], arms[1], last


def reopen_undecided(rows: list[dict], state, limits) -> list[str]:
    """Reopen the variants stopped "undecided" that the limits now given leave something to try.

    Each such variant and the base are rebuilt from the stage it stopped at
    (:func:`_stopped_pair`) and decided again (:func:`scalectl.ablation.decisions.decide`,
    the stored seed spread) under ``limits``: when that decision is no longer to
    stop (a larger ``--max-budget`` or ``--max-seeds``), the variant runs again
    from its budget and seeds (its next stage decides anew on fresh fits).  The
    same limits give the same stop, so the same command again reopens nothing.
    Returns the reopened names.
    """
    from scalectl.ablation.decisions import CANNOT_WIN, DECIDED, STOP, decide
    from scalectl.science.compare import UNDECIDED, Comparison, Row

    names = []
    for a in state.arms.values():
        if a.is_base or a.stopped is None or a.stopped in DECIDED or a.stopped == CANNOT_WIN:
            continue
        pair = _stopped_pair(rows, a.name)
        if pair is None:
            continue
        arm, base, row = pair
        comparison = None
        if row.get("dA") is not None and arm.fit is not None and base.fit is not None:
            cmp_rows = tuple(Row(x.name, x.fit.A, x.fit.B, x.fit.C_mid, x.fit.interval("A"),
                                 0.0 if x.is_base else row["dA"],
                                 (0.0, 0.0) if x.is_base else (row["dA_lo"], row["dA_hi"]),
                                 "baseline" if x.is_base else UNDECIDED, "" if x.is_base else row["reason"])
                             for x in (base, arm))
            comparison = Comparison(base.name, limits.margin, cmp_rows)
        d = decide([base, arm], comparison, limits, seed_sd=row.get("seed_sd"))
        if d[arm.name].action != STOP:
            a.stopped = None
            names.append(a.name)
    return names


# --------------------------------------------------------------------------- the report


def paths(rows: list[dict]) -> dict[str, list[dict]]:
    """Variant -> its stages in order (budget, seeds, action, verdict, A, dA)."""
    out_: dict[str, list[dict]] = {}
    for r in rows:
        hist = out_.setdefault(r["variant"], [])
        if hist and hist[-1]["action"] == "stop" and r["action"] == "stop" and not r["is_base"]:
            continue        # stopped: later stages repeat it
        hist.append(r)
    return out_


def summary(rows: list[dict], hours_per_step: dict[str, float], spent: float, margin: float) -> dict:
    """The adaptive ablation's outcome: per variant its path and verdict, the
    device-hours spent and those a fixed design would have spent (every arm to
    the largest budget used with the largest number of seeds used)."""
    ps = paths(rows)
    max_budget = max((r["budget"] for r in rows), default=0)
    max_seeds = max((r["seeds"] for r in rows), default=0)
    fixed = sum(max_budget * max_seeds * hours_per_step.get(v, 0.0) for v in ps)
    variants = []
    for v, hist in ps.items():
        last = hist[-1]
        variants.append({
            "variant": v, "is_base": last["is_base"], "verdict": last["verdict"], "reason": last["reason"],
            "path": [{"stage": h["stage"], "budget": h["budget"], "seeds": h["seeds"], "action": h["action"],
                      "A": h["A"], "A_lo": h["A_lo"], "A_hi": h["A_hi"], "dA": h["dA"],
                      "dA_lo": h["dA_lo"], "dA_hi": h["dA_hi"]} for h in hist],
            "budget": last["next_budget"], "seeds": last["next_seeds"],
        })
    return {"stages": 1 + max((r["stage"] for r in rows), default=-1), "spent_hours": spent,
            "fixed_hours": fixed, "fixed_design": {"budget": max_budget, "seeds": max_seeds},
            "saved_hours": fixed - spent, "saved_share": (1 - spent / fixed) if fixed > 0 else None,
            "margin": margin, "variants": variants}


def total_budget_line(state, backend, total_budget: float) -> str:
    """Why a loop stopped at ``--total-budget``: the next stage's runs and its cost
    (:func:`scalectl.ablation.adaptive.stage_cost`, device-hours) against the budget and
    what was spent."""
    from scalectl.ablation.adaptive import stage_cost

    running = ", ".join(f"{a.name} {a.budget} steps x{a.seeds}" for a in state.arms.values() if a.stopped is None)
    return (f"stopped: the next stage ({running}) would cost about {stage_cost(state, backend):.4g} device-hours, "
            f"past --total-budget {total_budget:g} ({state.spent_hours:.4g} spent)")


def needs(rows: list[dict], state, backend, limits) -> list[str]:
    """What each variant without a verdict would need next, one sentence each.

    rows: the ablation's stage rows (:meth:`scalectl.store.database.Store.stages`);
    state: the loop's state at its end; backend: for device-hours per step;
    limits: the :class:`scalectl.ablation.decisions.Limits` it ran under.  A
    variant still running (the loop stopped by ``--total-budget``) needs its
    next stage; one stopped "undecided" at ``--max-budget`` / ``--max-seeds``
    needs what :func:`scalectl.ablation.decisions.needed` says, from the fits
    of the stage it stopped at (compute per step: the fit's last compute /
    the budget), priced at the arms' device-hours per step (the base's part is
    shared by every variant that needs it).  Variants with a verdict need nothing.
    """
    from scalectl.ablation.decisions import CANNOT_WIN, DECIDED, needed

    out_ = []
    for a in state.arms.values():
        if a.is_base or a.stopped in DECIDED or a.stopped == CANNOT_WIN:
            continue
        if a.stopped is None:
            need = sum(max(0, a.budget - a.trained.get(i, 0)) for i in range(a.seeds))
            out_.append(f"{a.name} is undecided: it would next train to {a.budget} steps x {a.seeds} seed(s), "
                        f"about {need * backend.hours_per_step(a.name):.4g} device-hours")
            continue
        pair = _stopped_pair(rows, a.name)
        if pair is None:
            continue
        arm, base, last = pair
        arms = {arm.name: arm, base.name: base}
        dA = None if last.get("dA_lo") is None else (last["dA_lo"], last["dA_hi"])
        n = needed(arm, base, dA, limits)
        if n is None:
            out_.append(f"{a.name} is undecided: no estimate of what a verdict needs (no interval of dA)")
            continue
        if n.declining:
            verb = "declines" if len(n.declining) == 1 else "decline"
            text = (f"{a.name} is undecided: the pass rate of {' and '.join(n.declining)} {verb} after a peak: "
                    "no budget or seed count gives a sigmoid ceiling; a verdict needs a run that does not decline "
                    "(look at its curve, truncation and learning rate)")
        elif n.budgets:
            who = ("both ceilings" if len(n.budgets) == 2 else
                   "its ceiling" if a.name in n.budgets else "the base's ceiling")
            parts = [f"{v:,} for {k}" if v is not None else f"? for {k} (not fitted)" for k, v in n.budgets.items()]
            known = [v for v in n.budgets.values() if v is not None]
            hours = sum((v - arms[k].budget) * arms[k].seeds * backend.hours_per_step(k)
                        for k, v in n.budgets.items() if v is not None and v > arms[k].budget)
            text = (f"{a.name} is undecided: a verdict needs {who} identified ({limits.min_reach:g} x C_mid): "
                    f"about {parts[0].replace(' for', ' steps per run for', 1)}"
                    + "".join(f" and {p}" for p in parts[1:])
                    + (f" (--max-budget {max(known)})" if known else "")
                    + f", about {hours:.4g} device-hours more")
        else:
            hours = sum(max(0, n.seeds - x.seeds) * x.budget * backend.hours_per_step(x.name) for x in (arm, base))
            text = (f"{a.name} is undecided: a verdict needs about {n.seeds} seeds per arm to bring the dA "
                    f"interval to half the margin (--max-seeds {n.seeds}), about {hours:.4g} device-hours more")
        out_.append(text)
    return out_


# --------------------------------------------------------------------------- power planning


#: What the words of the power plan mean, printed with it (``ablate --plan``).
POWER_TERMS = {
    "arm": "the base or one variant; every arm trains its seeds at the budget",
    "budget": f"optimiser steps per run: {IDENTIFY_REACH:g} x C_mid of the base in steps (C_mid / compute per "
              "step): the one rule of enough data, where a ceiling counts as identified (the fit's advice, "
              "the adaptive loop and the seed runs of the margin use it too; docs/fitting.md)",
    "C_mid": "the compute at which the base's pass rate is halfway from R0 to its ceiling A",
    "reach": "the budget's compute as a multiple of C_mid",
    "s_fit": "the sd of A from one run's fit at that budget: half its bootstrap interval / z",
    "s_seed": "the seed-to-seed sd of A (Khatri et al. 2025, section 3: three seeds within +-0.015)",
    "dA half-width": "half the width of the interval of A_variant - A_base with these seeds: "
                     "sqrt(2) z sqrt(s_fit^2 + s_seed^2) / sqrt(seeds); the margin is resolved at margin / 2",
}


def power_plan(db, plan, limits, rate: float | None, assume: dict[str, float], level: float,
               from_run: str | None = None) -> dict:
    """Budget, seeds, cost and wall-clock to resolve a difference of the margin
    (:mod:`scalectl.ablation.power`).

    The base's numbers come from ``assume`` (C_mid, compute_per_step, s_fit, s_seed,
    seconds_per_step), else from the stored run ``from_run`` (any recipe: its fit, its
    compute and seconds per step), else from the largest completed stored run of the base
    recipe (any budget), else, for a simulated base, from its curve.  The wall-clock counts
    the runs ``launcher.max_parallel`` at a time.
    Raises UserError when none is available (naming the stored runs ``--from-run`` could
    use), or when ``from_run`` is not in the store.  ``warning`` in the result says when the
    stored fit it rests on does not identify the base's ceiling (None otherwise).
    """
    from scalectl.ablation.power import plan_power, wall_seconds
    from scalectl.curve.simulated import is_simulated

    base = plan.variants[0].recipe
    src = C_mid = cps = s_fit = warning = secs = None
    axis = base.fit.axis
    candidates: list[str] = []
    with open_with_journals(db, create=True) if Path(db).exists() else _nothing() as store:
        if from_run is not None and store is None:
            raise UserError(f"--from-run {from_run!r}: no store at {db}")
        found = _stored_run(store, from_run) if from_run is not None else (
            _largest_base_run(store, base) if store is not None else None)
        if found is not None:
            src, C_mid, cps, s_fit, warning, secs, axis = _from_stored_run(store, found, level)
            if rate is None and found.get("last_gpu_hours"):
                rate = found["last_gpu_hours"] / found["last_step"]
        elif store is not None:
            candidates = [r["name"] for r in store.list_runs() if (r.get("n_points") or 0) >= 2]
    if is_simulated(base.model.path):       # simulated points record no wall-clock: the curve's own
        sim = _from_simulated(base, limits, level)
        if src is None:
            (src, C_mid, cps, s_fit, rate_sim, _), axis = sim, "gpu_hours"
            rate = rate or rate_sim
        secs = secs if secs is not None else sim[5]
    C_mid, cps = assume.get("C_mid", C_mid), assume.get("compute_per_step", cps)
    s_fit, secs = assume.get("s_fit", s_fit), assume.get("seconds_per_step", secs)
    s_seed = assume.get("s_seed", limits.seed_sd)
    if assume:
        src = (src + " and " if src else "") + "stated assumptions (" + ", ".join(f"{k}={v:g}" for k, v in assume.items()) + ")"
    if C_mid is None or cps is None or s_fit is None:
        raise UserError(_no_base_curve(base, candidates))
    parallel = int(base.launcher.max_parallel)
    p = plan_power(C_mid=C_mid, compute_per_step=cps, s_fit=s_fit, s_seed=s_seed, arms=len(plan.variants),
                   margin=limits.margin, hours_per_step=rate, step_multiple=limits.step_multiple,
                   max_budget=limits.max_budget, max_seeds=limits.max_seeds, level=level,
                   reach=limits.min_reach, seconds_per_step=secs, parallel=parallel)
    runs = len(plan.variants) * limits.max_seeds
    worst = None if rate is None else runs * limits.max_budget * rate
    return {"source": src, **p.to_dict(), "worst_case_hours": worst, "rate": rate, "warning": warning,
            "worst_case_seconds": wall_seconds(runs, limits.max_budget, secs, parallel),
            "axis": axis, "C_mid": C_mid, "compute_per_step": cps, "terms": POWER_TERMS}


def _no_base_curve(base, candidates: list[str]) -> str:
    """Why ``--plan`` has no curve of the base, and the two ways to give it one."""
    runs = (f"; stored runs it could plan from: {', '.join(candidates[:8])}"
            + (f" (and {len(candidates) - 8} more)" if len(candidates) > 8 else "")) if candidates else ""
    return ("--plan needs the base's curve and there is no completed run of the base recipe in the store: "
            "plan from a stored run of a similar recipe with --from-run RUN (its C_mid, compute per step and "
            f"spread of A){runs}; or state it with --assume C_mid=...,compute_per_step=...,s_fit=... in "
            f"{base.fit.axis} (the base's fit.axis)")


def _stored_run(store, ref: str) -> dict:
    """The stored run ``ref`` (name or id) with its last step and GPU-hours, as
    :meth:`~scalectl.store.database.Store.list_runs` gives them."""
    run = store.get_run(ref)
    return next(r for r in store.list_runs() if r["id"] == run["id"])


def _largest_base_run(store, base) -> dict | None:
    """The completed stored run of the base recipe (same content whatever its budget, seed
    and name) that trained the most steps, or None."""
    from scalectl.recipe.schema import Recipe

    found = None
    for r in store.list_runs():
        rec = r.get("recipe") or {}
        if r["status"] != "completed" or not rec:
            continue
        d = dict(rec, budget=dict(rec["budget"], steps=base.budget.steps, gpu_hours=base.budget.gpu_hours),
                 seed=base.seed, name=base.name)
        try:
            same = Recipe.model_validate(d).content_hash == base.content_hash
        except ValueError:
            same = False
        if same and (found is None or (r.get("last_step") or 0) > (found.get("last_step") or 0)):
            found = r
    return found


def _from_stored_run(store, found: dict, level: float):
    """(source, C_mid, compute per step, sd of A from the fit, warning, wall-clock seconds per
    step, the fit's axis) from the fit of a stored run (400 resamples at ``level``); the
    warning says when that fit does not identify the ceiling."""
    from scalectl.curve import step_rate
    from scalectl.science.fits import FitOptions, fit_run

    curve, _, _ = fit_run(store, store.get_run(found["id"]), FitOptions(bootstrap=400, level=level))
    f = curve.fit
    C_mid, cps = f.C_mid, float(max(curve.compute)) / max(1, found["last_step"])
    rate = step_rate(store.points(found["id"]), f.axis)
    s_fit = f.standard_error("A")
    src = f"fit of stored run {found['name']} ({found['last_step']} steps)"
    warning = None
    weak = [fl.message for fl in f.flags
            if fl.code == "ceiling_not_identified" or (fl.code == "on_bound" and fl.param == "A")]
    if weak:
        warning = (f"the fit of {found['name']} does not identify its ceiling ({'; '.join(weak)}): its C_mid "
                   "and the spread of its A are not to be trusted, nor the budget and seeds below; "
                   f"extend {found['name']} (scalectl run --resume {found['name']} --set budget.steps=N) "
                   "or state the base with --assume")
    return src, C_mid, cps, s_fit, warning, None if rate is None else rate.seconds_per_step, f.axis


def _from_simulated(base, limits, level: float):
    """(source, C_mid, compute per step, sd of A from the fit, device-hours per step, wall
    seconds per step) of a simulated base: one draw of its curve to ``min_reach`` x C_mid, fitted."""
    from scalectl.curve import fit_sigmoid
    from scalectl.curve.simulated import draw_points, eval_steps, parse_spec

    c = parse_spec(base.model.path)
    steps = max(base.eval.every_steps, int(limits.min_reach * c.C_mid / c.hours_per_step))
    pts = draw_points(c, base.seed, eval_steps(steps, base.eval.every_steps))
    f = fit_sigmoid([p["gpu_hours"] for p in pts], [p["pass_rate"] for p in pts], bootstrap=400,
                    level=level)
    return (f"the simulated base curve (one draw to {steps} steps, fitted)", c.C_mid, c.hours_per_step,
            f.standard_error("A"), c.hours_per_step, c.seconds_per_step)


@contextlib.contextmanager
def _nothing():
    yield None


def write_manifest(db, plan, runs_dir: Path, backend: StoreBackend | None = None) -> None:
    """The ablation's manifest with the runs that exist, so ``scalectl report NAME`` finds them
    (``backend``: the runs standing for the planned ones, :meth:`StoreBackend.run_names`; without
    it, the runs of the planned names)."""
    from scalectl.ablation.campaign import manifest, manifest_path, write_manifest as write

    names = {}
    if backend is not None:
        names = backend.run_names()
    else:
        with open_with_journals(db) as store:
            for r in plan.runs:
                try:
                    names[r.name] = store.get_run(r.name)["name"]
                except UserError:
                    pass
    data = manifest(plan, names, db)
    for v in data["variants"]:
        v["runs"] = [n for n in v["runs"] if n in names.values()]
    data["adaptive"] = True
    write(manifest_path(runs_dir, plan.spec.name), data)
