"""Time one sigmoid fit with a 1,000-sample bootstrap on 100 evaluation points.

Target: under 1 s on a 2-core CPU machine.  Also times the fit without
bootstrap and the paper's grid method, for scale.

    python benchmarks/bench_fit.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from common import timed
from scalectl.curve import fit_sigmoid, sigmoid

from common import Figure, report

TARGET_S = 1.0


def points(n: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ScaleRL 8B batch 2048 (paper Table 1: C_mid 10909, B 1.70, A 0.645), R0 0.3, noise sd 0.01."""
    x = np.linspace(0.0, 50_000.0, n)
    y = sigmoid(x, 0.645, 1.70, 10909.0, 0.3) + np.random.default_rng(seed).normal(0, 0.01, n)
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    x, y = points()
    fit_sigmoid(x, y, min_compute=1500, bootstrap=10)  # warm up imports and caches
    cases = {
        "vp fit + 1000 bootstrap": lambda: fit_sigmoid(x, y, min_compute=1500, bootstrap=1000),
        "vp fit, no bootstrap": lambda: fit_sigmoid(x, y, min_compute=1500, bootstrap=0),
        "grid fit (paper A.5), no bootstrap": lambda: fit_sigmoid(x, y, min_compute=1500,
                                                                  method="grid", bootstrap=0),
    }
    results = {}
    for name, fn in cases.items():
        times = timed(fn, args.repeats)
        results[name] = statistics.median(times)
        print(f"{name:38s} median {results[name] * 1000:8.1f} ms  (min {min(times) * 1000:.1f}, "
              f"max {max(times) * 1000:.1f}, {args.repeats} runs, {len(x)} points)")
    report(Figure("bench_fit", "one fit with a 1,000-sample bootstrap on 100 points (median)",
                  results["vp fit + 1000 bootstrap"], "s", "<", TARGET_S))
    for name in ("vp fit, no bootstrap", "grid fit (paper A.5), no bootstrap"):
        report(Figure("bench_fit", f"{name} on 100 points (median)", results[name], "s"))


if __name__ == "__main__":
    main()
