"""Adaptive against fixed-budget ablations on simulated curves: accuracy and device-hours.

Twenty variants whose true ceilings differ from the base's (0.60) by
-0.08 .. +0.08 (five within the 0.02 margin), simulated with the noise of
``scalectl.curve.simulated`` (defaults measured on tiny runs).  The adaptive loop
(``scalectl.ablation.adaptive.run_loop``) runs once; then every fixed design (each
budget x seeds in the grid, all arms alike, judged once with the same
intervals and rules) is scored, and the cheapest one that reaches at least the
adaptive loop's number of true verdicts with no wrong higher/lower is quoted.

    .venv/bin/python scripts/adaptive_vs_fixed.py [--noise-seed 0] [--max-seeds 8] ...
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from scalectl.ablation.adaptive import SimBackend, fixed_design, initial_state, run_loop
from scalectl.ablation.decisions import CLAIM, MIN_REACH, Limits, is_true_verdict
from scalectl.curve.simulated import SimCurve

OFFSETS = (-0.08, -0.07, -0.06, -0.05, -0.045, -0.04, -0.035, -0.03, -0.01, -0.005,
           0.0, 0.005, 0.01, 0.03, 0.035, 0.04, 0.05, 0.06, 0.07, 0.08)


def arms(base: SimCurve = SimCurve(A=0.60, B=2.0, C_mid=0.1, R0=0.30, hours_per_step=0.001)):
    """The base and the twenty variants: name -> (curve, true dA)."""
    out = {"base": (base, 0.0)}
    for i, d in enumerate(OFFSETS):
        out[f"v{i:02d}"] = (replace(base, A=round(base.A + d, 4)), d)
    return out


def score(verdicts: dict, truth: dict, margin: float) -> tuple[int, int]:
    """(true verdicts, wrong higher/lower) of variant -> verdict against variant -> true dA."""
    marks = [is_true_verdict(verdicts[n], truth[n], margin) for n in truth]
    return sum(m is True for m in marks), sum(m is False for m in marks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--noise-seed", type=int, default=0)
    p.add_argument("--initial", type=int, default=100, help="stage-0 budget (steps)")
    p.add_argument("--max-budget", type=int, default=1600)
    p.add_argument("--max-seeds", type=int, default=6)
    p.add_argument("--bootstrap", type=int, default=400)
    p.add_argument("--level", type=float, default=0.99)
    p.add_argument("--budgets", default="400,600,800,1200")
    p.add_argument("--seeds", default="1,2,3,4,6")
    p.add_argument("--no-fixed", action="store_true")
    p.add_argument("--min-reach", type=float, default=MIN_REACH)
    p.add_argument("--claim", type=float, default=CLAIM)
    a = p.parse_args()
    spec = arms()
    curves = {n: c for n, (c, _) in spec.items()}
    truth = {n: d for n, (_, d) in spec.items() if n != "base"}
    backend = SimBackend(curves, every=10, seed0=a.noise_seed * 1000)
    fit_kw = {"bootstrap": a.bootstrap, "level": a.level}
    limits = Limits(max_budget=a.max_budget, max_seeds=a.max_seeds, step_multiple=10, min_reach=a.min_reach,
                    claim=a.claim)
    t0 = time.perf_counter()
    res = run_loop(backend, initial_state(list(curves), "base", a.initial), limits, fit_kw=fit_kw)
    wall = time.perf_counter() - t0
    verdicts = {n: d.verdict for n, d in res.decisions.items() if n != "base"}
    good, wrong = score(verdicts, truth, limits.margin)
    print(f"adaptive: {good}/20 true, {wrong} wrong, {res.spent_hours:.2f} device-hours, "
          f"{len(res.stages)} stages, ended: {res.ended} ({wall:.1f} s)")
    for n in truth:
        s = res.state.arms[n]
        print(f"  {n} dA {truth[n]:+.3f}: {verdicts[n]:<24} {s.budget} steps x{s.seeds}")
    b = res.state.arms["base"]
    print(f"  base: {b.budget} steps x{b.seeds}")
    if a.no_fixed:
        return
    best = None
    for budget in map(int, a.budgets.split(",")):
        for seeds in map(int, a.seeds.split(",")):
            v, hours = fixed_design(backend, list(curves), "base", budget, seeds, limits, fit_kw=fit_kw)
            g, w = score(v, truth, limits.margin)
            print(f"fixed {budget} steps x{seeds}: {g}/20 true, {w} wrong, {hours:.2f} device-hours", flush=True)
            if g >= good and w == 0 and (best is None or hours < best[0]):
                best = (hours, budget, seeds)
    if best is None:
        print("no fixed design in the grid reaches the adaptive loop's accuracy")
    else:
        print(f"cheapest fixed design as accurate: {best[1]} steps x{best[2]}, {best[0]:.2f} device-hours; "
              f"adaptive/fixed = {res.spent_hours / best[0]:.2f}")


if __name__ == "__main__":
    main()
