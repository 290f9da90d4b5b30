"""The study: the published recipes compared on one setup, judged against that setup's own margin.

Three steps, each through the ``scalectl`` commands a user would type (docs/study.md):

1. ScaleRL on ``--seeds`` seeds (runs ``study-scalerl-b<steps>-s<seed>``; the budget is part of
   a recipe's hash, so each budget has runs of its own): the seed-to-seed spread of
   their ceilings is the setup's margin (``scalectl margin``; the rule is in docs/fitting.md,
   "Your own margin").
2. ``scalectl ablate ablations/recipes.toml --margin auto``: GRPO, DAPO, Magistral, MiniMax and
   ScaleRL, each judged against ScaleRL with that measured margin (the ablation reuses the
   seed-0 run of step 1, same recipe hash and seed); ``--until-decided`` extends runs and adds
   seeds where a verdict is still open.
3. The ablation's report (HTML with the figures, summary.md) in ``--out``, and the margin's
   JSON beside it.

Run it again after an interruption: completed runs are reused, stopped ones resumed, and
``ablate`` picks up where it stopped.  A run of the same recipe content and seed already in
the store under another name (``scalectl run scalerl``'s ``scalerl-s0``) stands for its seed:
``scalectl run`` reuses, resumes or extends it rather than training it again, and the margin
is measured from the runs that stand for the seeds.  The budget is checked against the one
rule of enough data (:data:`scalectl.curve.planning.IDENTIFY_REACH` x C_mid, docs/fitting.md):
``--plan`` says whether the budget reaches it on the stored runs, and what budget would.

    python scripts/study.py                              # the default setup, its budget (750 steps) per run
    python scripts/study.py --setup simulated --budget-steps 150 --out reports/study-sim
    python scripts/study.py --plan                       # what it would train, and its price; trains nothing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCALECTL = str(Path(sys.executable).parent / "scalectl")


def scalectl(*args: str, capture: bool = False, stdout: bool = False) -> subprocess.CompletedProcess:
    """Run one ``scalectl`` command; raise SystemExit with its status when it fails.  ``capture``:
    keep its output; ``stdout``: keep its standard output only (its progress on stderr is shown)."""
    print("$ scalectl " + " ".join(args), flush=True)
    proc = subprocess.run([SCALECTL, *args], text=True, capture_output=capture,
                          stdout=subprocess.PIPE if stdout and not capture else None)
    if proc.returncode != 0:
        if capture or stdout:
            sys.stderr.write((proc.stdout or "") + (proc.stderr or ""))
        raise SystemExit(proc.returncode)
    return proc


def run_statuses(db: str) -> dict[str, str]:
    """Run name -> status of every run in the store (empty for a new store)."""
    if not Path(db).exists():
        return {}
    rows = json.loads(scalectl("status", "--json", "--db", db, capture=True).stdout)
    return {row["name"]: row["status"] for row in rows}


def seed_runs(args) -> list[str]:
    """Step 1: ScaleRL on ``args.seeds`` seeds, each trained, resumed, extended or reused; the names
    of the runs that stand for the seeds (``study-scalerl-b<steps>-s<seed>``, or a stored run of the
    same recipe content and seed under another name, which ``scalectl run`` reuses, resumes or
    extends: its ``--json`` names it)."""
    names = []
    for seed in range(args.seeds):
        name = f"study-scalerl-b{args.budget_steps}-s{seed}"
        if run_statuses(args.db).get(name) == "completed":
            print(f"{name}: completed, reused", flush=True)
            names.append(name)
            continue
        done = scalectl("run", "scalerl", "--setup", args.setup, "--seed", str(seed), "--name", name,
                        "--set", f"budget.steps={args.budget_steps}", "--runs-dir", args.runs_dir, "--db", args.db,
                        "--json", stdout=True)
        ran = json.loads(done.stdout)
        if ran.get("outcome") == "attached":
            raise SystemExit(f"{ran['run']} (seed {seed} of ScaleRL) is {ran['status']} in another job: run the "
                             "study again once it has ended")
        if ran["run"] != name:
            print(f"{name}: {ran['run']} trains the same recipe and seed: it stands for seed {seed}", flush=True)
        names.append(ran["run"])
    return names


#: Wall-clock seconds per optimiser step of each recipe on the default setup (``tiny-cpu``), measured
#: by ``make study`` on a 2-core Intel Xeon on 2026-12-03 (docs/study.md, "The result on the default
#: setup"; load 2-5, the study's own processes included), evaluations included: the price of a recipe
#: no run in the store has measured.  ScaleRL is the median of its 3 seeds (0.79-0.98 s); DAPO's
#: dynamic sampling generates for more prompts than a step trains on.
DEFAULT_SECONDS_PER_STEP = {"tiny-cpu": {"scalerl": 0.90, "grpo": 0.87, "dapo": 2.53, "magistral": 0.94,
                                         "minimax": 1.42}}
RECIPES = ("scalerl", "grpo", "dapo", "magistral", "minimax")


def _seconds(run: dict) -> float | None:
    """Wall-clock seconds from a run's start to its end (None while it has no end)."""
    if not run.get("started") or not run.get("ended"):
        return None
    return (datetime.fromisoformat(run["ended"]) - datetime.fromisoformat(run["started"])).total_seconds()


def seconds_per_step(runs: list[dict], setup: str) -> dict[str, tuple[float, str]]:
    """Recipe -> (wall-clock seconds per step, where the figure comes from): the median over the
    store's completed runs of that recipe (named as the study and its ablation name them:
    ``study-scalerl-b500-s0``, ``recipes--grpo--s0``; other runs of the store do not count),
    else :data:`DEFAULT_SECONDS_PER_STEP` for the setup, else nothing."""
    out: dict[str, tuple[float, str]] = {}
    for recipe in RECIPES:
        rates = sorted(secs / run["last_step"] for run in runs
                       if run.get("status") == "completed" and run.get("last_step")
                       and (run["name"].startswith(f"study-{recipe}-b") or f"--{recipe}--" in run["name"])
                       and (secs := _seconds(run)) is not None)
        if rates:
            out[recipe] = (rates[len(rates) // 2], f"median of {len(rates)} completed run(s) in the store")
        elif recipe in DEFAULT_SECONDS_PER_STEP.get(setup, {}):
            out[recipe] = (DEFAULT_SECONDS_PER_STEP[setup][recipe], "measured on a quiet 2-core machine (docs/study.md)")
    return out


def stored_elsewhere(args, seed: int):
    """What ``scalectl run`` would do for ScaleRL's ``seed`` with a stored run of the same recipe content
    and seed under another name (:func:`scalectl.launch.runs.stored_run_for`): (action, run row, steps
    trained), or None (no store, or no such run)."""
    from scalectl.launch.runs import stored_run_for
    from scalectl.recipe.load import load
    from scalectl.store.database import Store

    if not Path(args.db).exists():
        return None
    recipe = load("scalerl", args.setup, [f"budget.steps={args.budget_steps}", f"seed={seed}"])
    with Store.open(args.db, create=False) as store:
        return stored_run_for(store, recipe)


def rule_line(args) -> str:
    """Whether ``--budget-steps`` reaches the one rule of enough data (:data:`scalectl.defaults.IDENTIFY_REACH`
    x C_mid, where a ceiling counts as identified and a margin counts a run), and the budget that would:
    C_mid and the compute per step from the stored ScaleRL run of this setup that trained the most steps
    (whatever its name, budget and seed), else from the simulated curve of a simulated setup."""
    from scalectl.curve.planning import identifying_steps, step_rate
    from scalectl.curve.simulated import is_simulated, parse_spec
    from scalectl.defaults import IDENTIFY_REACH
    from scalectl.errors import UserError
    from scalectl.launch.runs import same_training
    from scalectl.recipe.load import load
    from scalectl.science.fits import FitOptions, fit_run
    from scalectl.store.database import Store

    recipe = load("scalerl", args.setup, [f"budget.steps={args.budget_steps}"])
    every = recipe.eval.every_steps
    C_mid = per_step = source = None
    if Path(args.db).exists():
        with Store.open(args.db, create=False) as store:
            found = [f for seed in range(args.seeds) for f in same_training(store, recipe, seed, refresh=False)]
            for row, _steps in sorted(found, key=lambda f: -f[1]):
                try:
                    fit = fit_run(store, row, FitOptions(bootstrap=0), log=lambda _m: None)[0].fit
                except UserError:
                    continue
                rate = step_rate(store.points(row["id"]), fit.axis)
                if rate is not None:
                    C_mid, per_step, source = fit.C_mid, rate.compute_per_step, f"the fit of {row['name']}"
                    break
    if C_mid is None and is_simulated(recipe.model.path):
        curve = parse_spec(recipe.model.path)
        C_mid, per_step, source = curve.C_mid, curve.hours_per_step, "the simulated curve"
    rule = f"the rule of enough data ({IDENTIFY_REACH:g} x C_mid, docs/fitting.md)"
    if C_mid is None:
        return f"{rule}: no stored ScaleRL run of this setup to measure C_mid on yet (docs/study.md has past runs)"
    need = identifying_steps(C_mid, per_step, every)
    reach = args.budget_steps * per_step / C_mid
    if args.budget_steps >= need:
        return f"{rule}: {args.budget_steps} steps reach {reach:.1f} x C_mid by {source}: enough"
    return (f"{rule}: {args.budget_steps} steps reach only {reach:.1f} x C_mid by {source}: the margin counts no "
            f"run whose ceiling is not identified; about {need} steps would (--budget-steps {need})")


def plan(args) -> int:
    """Print what the study would train (every run new, resumed or reused) and its price in
    steps and wall-clock on this machine, one run at a time; train nothing."""
    runs = (json.loads(scalectl("status", "--json", "--db", args.db, capture=True).stdout)
            if Path(args.db).exists() else [])
    by_name = {run["name"]: run for run in runs}
    rate = seconds_per_step(runs, Path(args.setup).stem)
    todo: dict[str, int] = {}
    print(f"step 1: ScaleRL on {args.seeds} seeds, {args.budget_steps} steps each")
    for seed in range(args.seeds):
        name = f"study-scalerl-b{args.budget_steps}-s{seed}"
        run = by_name.get(name)
        other = stored_elsewhere(args, seed) if run is None else None
        if other is not None:          # what `scalectl run` does with a run of the same recipe and seed
            action, row, done = other
            left = max(0, args.budget_steps - done) if action in ("resume", "extend") else 0
            verb = {"reuse": "reuses", "attach": "waits for", "resume": "resumes", "extend": "extends"}[action]
            print(f"  {name}: {verb} {row['name']} (same recipe and seed, {row['status']} at step {done}), "
                  f"{left} steps to train")
            todo["scalerl"] = todo.get("scalerl", 0) + left
            continue
        done = run["last_step"] or 0 if run else 0
        left = 0 if run and run["status"] == "completed" else args.budget_steps - done
        what = ("new" if run is None else "reused" if left == 0
                else f"running (step {done})" if run["status"] == "running" else f"resumed at step {done}")
        print(f"  {name}: {what}, {left} steps to train")
        todo["scalerl"] = todo.get("scalerl", 0) + left
    print("  " + rule_line(args))
    print("step 2: the recipes against ScaleRL (scalectl ablate --dry-run):")
    dry = scalectl("ablate", str(ROOT / "ablations" / "recipes.toml"), "--setup", args.setup, "--budget-steps",
                   str(args.budget_steps), "--margin", "auto", "--runs-dir", args.runs_dir, "--db", args.db, "--dry-run",
                   capture=True).stdout
    print("  " + "\n  ".join(dry.rstrip().splitlines()))
    for recipe in RECIPES[1:]:
        run = by_name.get(f"recipes--{recipe}--s0")
        left = 0 if run and run["status"] == "completed" else args.budget_steps - ((run or {}).get("last_step") or 0)
        todo[recipe] = todo.get(recipe, 0) + left
    total, unknown = 0.0, []
    print("price, one run at a time (launcher.max_parallel = 1):")
    for recipe, steps in todo.items():
        if recipe not in rate:
            unknown.append(recipe)
            print(f"  {recipe}: {steps} steps, no rate measured for this setup")
            continue
        secs, source = rate[recipe]
        total += steps * secs
        print(f"  {recipe}: {steps} steps x {secs:.2f} s = {steps * secs / 60:.1f} min ({source})")
    more = f", plus {', '.join(unknown)} unpriced" if unknown else ""
    print(f"total: {sum(todo.values())} steps, about {total / 60:.0f} min of wall-clock{more}; the warm start "
          "(1.5-5 min, once per machine) and --until-decided's extensions come on top")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", default="tiny-cpu", help="setup preset or file (default tiny-cpu)")
    parser.add_argument("--budget-steps", type=int, default=None,
                        help="optimiser steps per run (default: the setup's budget.steps)")
    parser.add_argument("--seeds", type=int, default=3, help="ScaleRL seeds that measure the margin (>= 3)")
    parser.add_argument("--db", default=os.environ.get("SCALECTL_DB", "scalectl.db"))
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--out", default="reports/study")
    parser.add_argument("--until-decided", action="store_true",
                        help="extend runs and add seeds until every verdict is decided")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--plan", action="store_true",
                        help="print what would be trained and its price in steps and wall-clock; train nothing")
    args = parser.parse_args(argv)
    if args.seeds < 3:
        parser.error(f"--seeds {args.seeds}: a margin needs at least 3 seeds")
    if args.budget_steps is None:
        from scalectl.recipe.load import load

        args.budget_steps = load("scalerl", args.setup).budget.steps
    if args.plan:
        return plan(args)

    names = seed_runs(args)
    print(rule_line(args), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    margin = scalectl("margin", *names, "--bootstrap", str(args.bootstrap), "--db", args.db, "--json",
                      capture=True).stdout
    (Path(args.out) / "margin.json").write_text(margin)
    print(f"margin measured from {', '.join(names)}: written to {args.out}/margin.json", flush=True)
    ablate = ["ablate", str(ROOT / "ablations" / "recipes.toml"), "--setup", args.setup,
              "--budget-steps", str(args.budget_steps), "--margin", "auto", "--bootstrap", str(args.bootstrap),
              "--runs-dir", args.runs_dir, "--out", args.out, "--db", args.db]
    scalectl(*ablate, *(["--until-decided"] if args.until_decided else []))
    print(f"report: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
