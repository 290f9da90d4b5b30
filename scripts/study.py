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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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
    args = parser.parse_args(argv)
    if args.seeds < 3:
        parser.error(f"--seeds {args.seeds}: a margin needs at least 3 seeds")

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
