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
``ablate`` picks up where it stopped.

    python scripts/study.py                              # the default setup, 500 steps per run
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


def scalectl(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """Run one ``scalectl`` command; raise SystemExit with its status when it fails."""
    print("$ scalectl " + " ".join(args), flush=True)
    proc = subprocess.run([SCALECTL, *args], text=True, capture_output=capture)
    if proc.returncode != 0:
        if capture:
            sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(proc.returncode)
    return proc


def run_statuses(db: str) -> dict[str, str]:
    """Run name -> status of every run in the store (empty for a new store)."""
    if not Path(db).exists():
        return {}
    rows = json.loads(scalectl("status", "--json", "--db", db, capture=True).stdout)
    return {row["name"]: row["status"] for row in rows}


def seed_runs(args) -> list[str]:
    """Step 1: ScaleRL on ``args.seeds`` seeds, each trained, resumed or reused."""
    names = []
    for seed in range(args.seeds):
        name = f"study-scalerl-b{args.budget_steps}-s{seed}"
        names.append(name)
        status = run_statuses(args.db).get(name)
        if status == "completed":
            print(f"{name}: completed, reused", flush=True)
            continue
        if status is None:
            scalectl("run", "scalerl", "--setup", args.setup, "--seed", str(seed), "--name", name,
                     "--set", f"budget.steps={args.budget_steps}", "--runs-dir", args.runs_dir, "--db", args.db)
        else:
            scalectl("run", "--resume", name, "--runs-dir", args.runs_dir, "--db", args.db)
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
        done = run["last_step"] or 0 if run else 0
        left = 0 if run and run["status"] == "completed" else args.budget_steps - done
        what = ("new" if run is None else "reused" if left == 0
                else f"running (step {done})" if run["status"] == "running" else f"resumed at step {done}")
        print(f"  {name}: {what}, {left} steps to train")
        todo["scalerl"] = todo.get("scalerl", 0) + left
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
    parser.add_argument("--budget-steps", type=int, default=500, help="optimiser steps per run (default 500)")
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
    if args.plan:
        return plan(args)

    names = seed_runs(args)
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
