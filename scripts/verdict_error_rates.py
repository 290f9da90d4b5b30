"""How often does ``compare`` call a tie, or a difference of half the margin, beyond the margin?

Each draw is a pair of independent runs: a base curve of
:data:`ceiling_identification.CURVES` (draw i uses curve i mod 8) and the same
curve with its ceiling moved by ``delta``, each with 61 evaluations evenly
spaced from compute 0 to ``--reach`` x C_mid (default 2.5) and independent
normal noise of sd ``--sd`` (default 0.01), fitted as ``scalectl compare``
fits them (window from :func:`default_min_compute`, R0 measured, 1,000
bootstrap resamples, 95 % intervals) and compared with margin 0.02.  Noise
seeds: ``--seed-base + 2 i`` (base) and ``+ 2 i + 1`` (run).  Per delta it prints
the count of each verdict; "higher"/"lower" is wrong for |delta| < margin.

    PYTHONPATH=src nice -n 10 .venv/bin/python scripts/verdict_error_rates.py \\
        [--draws 200] [--deltas 0,0.01,-0.01,0.03] [--seed-base 40000]

About 0.6 s a pair on a loaded 2-core machine: 4 x 200 pairs take 8-10 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceiling_identification import CURVES

from scalectl.curve import default_min_compute, fit_sigmoid, sigmoid
from scalectl.defaults import MARGIN
from scalectl.science.compare import HIGHER, LOWER, VERDICTS, RunCurve, compare


def run_curve(c_mid, b, a, r0, axis, reach, sd, seed, bootstrap) -> RunCurve:
    """One simulated run, fitted: 61 points over 0..reach x C_mid, noise sd ``sd``."""
    x = np.linspace(0.0, reach * c_mid, 61)
    y = np.clip(sigmoid(x, a, b, c_mid, r0) + np.random.default_rng(seed).normal(0.0, sd, x.size), 0.0, 1.0)
    fit = fit_sigmoid(x, y, min_compute=default_min_compute(x, axis), axis=axis, bootstrap=bootstrap, seed=seed)
    return RunCurve(x, y, fit)


def verdicts(delta: float, draws: int, reach: float, sd: float, seed_base: int, bootstrap: int,
             margin: float) -> Counter:
    """Verdict counts of ``draws`` pairs whose true ceilings differ by ``delta``."""
    out: Counter = Counter()
    for i in range(draws):
        _, c_mid, b, a, r0, axis = CURVES[i % len(CURVES)]
        base = run_curve(c_mid, b, a, r0, axis, reach, sd, seed_base + 2 * i, bootstrap)
        run = run_curve(c_mid, b, a + delta, r0, axis, reach, sd, seed_base + 2 * i + 1, bootstrap)
        out[compare({"base": base, "run": run}, baseline="base", margin=margin).row("run").verdict] += 1
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--deltas", default="0,0.01,-0.01,0.03")
    p.add_argument("--reach", type=float, default=2.5)
    p.add_argument("--sd", type=float, default=0.01)
    p.add_argument("--seed-base", type=int, default=40_000)
    p.add_argument("--bootstrap", type=int, default=1000)
    a = p.parse_args()
    names = [v for v in VERDICTS if v != "baseline"]
    print(f"{a.draws} pairs per row, sd {a.sd}, points to {a.reach} x C_mid, margin {MARGIN}, "
          f"seeds {a.seed_base}..{a.seed_base + 2 * a.draws - 1}")
    print("| true dA | " + " | ".join(names) + " | called beyond the margin |")
    print("|---|" + "---|" * (len(names) + 1))
    for delta in map(float, a.deltas.split(",")):
        t0 = time.perf_counter()
        c = verdicts(delta, a.draws, a.reach, a.sd, a.seed_base, a.bootstrap, MARGIN)
        beyond = c[HIGHER] + c[LOWER]
        print(f"| {delta:+g} | " + " | ".join(str(c[v]) for v in names)
              + f" | {beyond}/{a.draws} ({beyond / a.draws:.1%}) |  <!-- {time.perf_counter() - t0:.0f} s -->",
              flush=True)


if __name__ == "__main__":
    main()
