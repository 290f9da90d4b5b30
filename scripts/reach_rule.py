"""How far past C_mid must a run go before its fit pins the ceiling A?  The measurement behind
:data:`scalectl.curve.planning.IDENTIFY_REACH`, the one rule of "enough data".

Two parts, both printed as Markdown tables (docs/fitting.md, "How far a run must go"):

* **Simulated runs.** Draw i is the curve i mod 8 of ``scripts/ceiling_identification.py``
  (the paper's Table 1 rows, the tiny CPU setup's fit, the simulated backend's default curve,
  a steep one), drawn with the simulated backend's noise (:func:`scalectl.curve.simulated.draw_points`:
  evaluation sd 0.006, correlated AR(1) sd 0.006 with lag-one correlation 0.6, measured on real
  tiny runs; no seed offset, so the run's own ceiling is the curve's A), an evaluation every
  C_mid / 10 of compute from 0 to ``reach`` x C_mid, fitted as ``scalectl fit`` fits a run
  (R0 measured at compute 0, the default window, ``--bootstrap`` resamples, 95 % intervals).
  Per reach: the share flagged (``ceiling_not_identified`` or A on a bound), the mean and the
  spread of the error of A, the share of fits off by more than half the margin, the median
  width of the A interval and the share of intervals within 2 x the margin (one run's A
  known to +-margin), and the coverage of the interval.
* **Real runs.** The two default-setup ScaleRL runs extended to 2,000 steps
  (``tests/data/testbed_long_runs.json``), fitted on their points up to each cut (steps
  250-1,250: past about step 1,300 the learnable prompts run out and the pass rate falls,
  docs/study.md), with each cut's reach (last compute / the cut's own C_mid), A and the
  width of its interval.

    PYTHONPATH=src nice -n 10 .venv/bin/python scripts/reach_rule.py [--draws 80] [--reaches 2,3,4,5,6,8]

About 0.2-0.7 s a fit on a loaded 2-core machine: the default 6 x 80 simulated fits and the
18 real ones take 5-10 minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from scalectl.curve import default_min_compute, fit_sigmoid
from scalectl.curve.simulated import SimCurve, draw_points, eval_steps
from scalectl.defaults import MARGIN

ROOT = Path(__file__).resolve().parent.parent
#: (A, B, R0) of the curves of scripts/ceiling_identification.py (C_mid scaled to 1 here: only
#: the reach matters).
CURVES = ((0.610, 1.92, 0.30), (0.645, 1.89, 0.30), (0.605, 1.77, 0.30), (0.645, 1.70, 0.30),
          (0.710, 1.65, 0.30), (0.820, 1.10, 0.47), (0.600, 2.00, 0.30), (0.900, 3.00, 0.10))
#: Steps per C_mid of a simulated run, and the evaluation interval: an evaluation every C_mid / 10.
STEPS_PER_C_MID, EVERY = 100, 10


def unidentified(fit) -> bool:
    """The fit says its ceiling is not identified (what ``compare`` and the margin leave out)."""
    return fit.has_flag("ceiling_not_identified") or any(f.code == "on_bound" and f.param == "A" for f in fit.flags)


def simulated_row(reach: float, draws: int, seed_base: int, bootstrap: int) -> dict:
    """One row of the simulated table: the fits of ``draws`` runs cut at ``reach`` x C_mid."""
    errors, widths, flagged, covered = [], [], 0, 0
    for i in range(draws):
        a, b, r0 = CURVES[i % len(CURVES)]
        curve = SimCurve(A=a, B=b, C_mid=1.0, R0=r0, hours_per_step=1.0 / STEPS_PER_C_MID, seed_sd=0.0)
        pts = draw_points(curve, seed_base + i, eval_steps(round(reach * STEPS_PER_C_MID), EVERY))
        x = np.array([p["gpu_hours"] for p in pts])
        y = np.array([p["pass_rate"] for p in pts])
        fit = fit_sigmoid(x, y, min_compute=default_min_compute(x), bootstrap=bootstrap, seed=i)
        lo, hi = fit.interval("A")
        flagged += unidentified(fit)
        covered += lo <= a <= hi
        errors.append(fit.A - a)
        widths.append(hi - lo)
    e, w = np.array(errors), np.array(widths)
    return {"reach": reach, "draws": draws, "flagged": flagged, "mean_error": float(e.mean()),
            "sd_error": float(e.std(ddof=1)), "off_half_margin": int((np.abs(e) > MARGIN / 2).sum()),
            "median_width": float(np.median(w)), "within_2_margins": int((w <= 2 * MARGIN).sum()),
            "covered": covered}


def real_rows(path: Path, cuts, bootstrap: int) -> list[dict]:
    """The fits of each stored run of ``path`` cut at each step of ``cuts`` (its fit axis, its window)."""
    rows = []
    for run in json.loads(path.read_text())["runs"]:
        axis = run["fit"].get("axis", "flops")
        pts = [p for p in run["points"] if p.get(axis) is not None and p.get("pass_rate") is not None]
        for cut in cuts:
            use = [p for p in pts if p["step"] <= cut]
            x = np.array([float(p[axis]) for p in use])
            y = np.array([float(p["pass_rate"]) for p in use])
            fit = fit_sigmoid(x, y, min_compute=float(run["fit"].get("min_compute") or 0.0), axis=axis,
                              bootstrap=bootstrap, seed=0)
            lo, hi = fit.interval("A")
            rows.append({"run": run["name"], "step": cut, "reach": float(x.max()) / fit.C_mid, "A": fit.A,
                         "lo": lo, "hi": hi, "width": hi - lo, "flagged": unidentified(fit)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=80)
    p.add_argument("--seed-base", type=int, default=60_000)
    p.add_argument("--reaches", default="2,3,4,5,6,8")
    p.add_argument("--bootstrap", type=int, default=400)
    p.add_argument("--cuts", default="250,375,500,625,750,875,1000,1125,1250")
    p.add_argument("--skip-real", action="store_true")
    a = p.parse_args()
    print(f"simulated: {a.draws} draws per reach, seeds {a.seed_base}..{a.seed_base + a.draws - 1}, "
          f"bootstrap {a.bootstrap}, margin {MARGIN}")
    print("| reach (x C_mid) | flagged | error of A: mean (sd) | off by > margin/2 | median width of the A "
          "interval | width <= 2 x margin | interval covers A |")
    print("|---|---|---|---|---|---|---|")
    for reach in map(float, a.reaches.split(",")):
        t0 = time.perf_counter()
        r = simulated_row(reach, a.draws, a.seed_base, a.bootstrap)
        n = r["draws"]
        print(f"| {reach:g} | {r['flagged']}/{n} | {r['mean_error']:+.4f} ({r['sd_error']:.4f}) | "
              f"{r['off_half_margin']}/{n} | {r['median_width']:.3f} | {r['within_2_margins']}/{n} | "
              f"{r['covered']}/{n} |  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)
    if a.skip_real:
        return
    print()
    print("real: tests/data/testbed_long_runs.json, each run fitted on its points up to the step")
    print("| run | step | reach (x C_mid of the cut's fit) | A [95 %] | width | flagged |")
    print("|---|---|---|---|---|---|")
    for r in real_rows(ROOT / "tests" / "data" / "testbed_long_runs.json", [int(c) for c in a.cuts.split(",")],
                       a.bootstrap):
        print(f"| {r['run']} | {r['step']} | {r['reach']:.1f} | {r['A']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] | "
              f"{r['width']:.3f} | {'yes' if r['flagged'] else '-'} |", flush=True)


if __name__ == "__main__":
    main()
