"""Does the fit know when the points do not identify the ceiling?  Synthetic curves cut short.

Each draw is one curve of :data:`CURVES` (the paper's Table 1 rows and three of
our own), 61 evaluations evenly spaced from compute 0 to ``cut`` x C_mid, with
independent normal noise of sd ``sd`` (pass rates clipped to [0, 1]), fitted as
``scalectl fit`` fits an imported run: window from :func:`default_min_compute`,
R0 measured at compute 0 (``--r0 fit`` drops that point, as in an import
without a step-0 evaluation, and R0 is fitted), 1,000 bootstrap resamples, 95 %
intervals.  Draw i uses curve i mod 8 and noise seed ``--seed-base + i``.  Per
(cut, sd) it prints: the share of fits flagged ``ceiling_not_identified`` (or A
on a bound), the coverage of the 95 % interval of A over all fits, and, among
the unflagged fits, how many have an interval that misses the true A by more
than the margin (0.02) and their coverage.

    PYTHONPATH=src nice -n 10 .venv/bin/python scripts/ceiling_identification.py \\
        [--draws 200] [--seed-base 20000] [--cuts 0.5,0.6,0.8,1.0,1.2,2.5,5] [--sds 0.005,0.01] [--r0 fit]

The rule was chosen on other seeds (``--seed-base 0`` and hand-picked draws);
the tables of docs/fitting.md use ``--seed-base 20000``.  About 0.2-0.7 s a fit
on a loaded 2-core machine: the default 14 x 200 fits take 15-30 minutes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from scalectl.curve import default_min_compute, fit_sigmoid, sigmoid
from scalectl.defaults import MARGIN

#: (name, C_mid, B, A, R0, axis): Table 1 of Khatri et al. 2025 (GPU-hours, R0 0.3), then our own:
#: the tiny CPU setup's fit (README, FLOPs), the simulated backend's default curve, a steep one.
CURVES = (
    ("ScaleRL 8B batch 768", 2542.0, 1.92, 0.610, 0.30, "gpu_hours"),
    ("ScaleRL 8B 32k generation", 11272.0, 1.89, 0.645, 0.30, "gpu_hours"),
    ("ScaleRL 8B batch 512", 2818.0, 1.77, 0.605, 0.30, "gpu_hours"),
    ("ScaleRL 8B batch 2048", 10909.0, 1.70, 0.645, 0.30, "gpu_hours"),
    ("ScaleRL 17Bx16 MoE", 4242.0, 1.65, 0.710, 0.30, "gpu_hours"),
    ("tiny-cpu scalerl", 1.8e12, 1.10, 0.820, 0.47, "flops"),
    ("simulated default", 0.1, 2.00, 0.600, 0.30, "gpu_hours"),
    ("steep", 500.0, 3.00, 0.900, 0.10, "gpu_hours"),
)


def draw(i: int, cut: float, sd: float, seed_base: int, r0: str = "measured", points: int = 61):
    """Curve i mod 8 cut at ``cut`` x C_mid with noise sd ``sd``: (curve, compute, pass rate), ``points``
    evaluations from compute 0, or ``points - 1`` without the one at compute 0 when ``r0`` is "fit"
    (an imported curve without a step-0 evaluation: R0 is then fitted)."""
    curve = CURVES[i % len(CURVES)]
    _, c_mid, b, a, r0_true, _axis = curve
    x = np.linspace(0.0, cut * c_mid, points)
    y = sigmoid(x, a, b, c_mid, r0_true) + np.random.default_rng(seed_base + i).normal(0.0, sd, x.size)
    y = np.clip(y, 0.0, 1.0)
    return (curve, x[1:], y[1:]) if r0 == "fit" else (curve, x, y)


def unidentified(fit) -> bool:
    """The fit says its ceiling is not identified (what ``compare`` calls undecided)."""
    return fit.has_flag("ceiling_not_identified") or any(f.code == "on_bound" and f.param == "A" for f in fit.flags)


def study(cut: float, sd: float, draws: int, seed_base: int, bootstrap: int, margin: float,
          r0: str = "measured") -> dict:
    """One row of the table: counts over ``draws`` fits."""
    out = {"cut": cut, "sd": sd, "draws": draws, "flagged": 0, "covered": 0, "unflagged": 0,
           "unflagged_covered": 0, "unflagged_missed": 0, "widths": []}
    for i in range(draws):
        (_, _, _, a, _, axis), x, y = draw(i, cut, sd, seed_base, r0)
        fit = fit_sigmoid(x, y, min_compute=default_min_compute(x, axis), axis=axis, bootstrap=bootstrap, seed=i)
        lo, hi = fit.interval("A")
        inside = lo <= a <= hi
        out["covered"] += inside
        if unidentified(fit):
            out["flagged"] += 1
            continue
        out["unflagged"] += 1
        out["unflagged_covered"] += inside
        out["unflagged_missed"] += (a - hi > margin) or (lo - a > margin)
        out["widths"].append(hi - lo)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--seed-base", type=int, default=20_000)
    p.add_argument("--cuts", default="0.5,0.6,0.8,1.0,1.2,2.5,5")
    p.add_argument("--sds", default="0.005,0.01")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--r0", choices=("measured", "fit"), default="measured",
                   help="measured: an evaluation at compute 0 (scalectl runs); fit: none (imports)")
    a = p.parse_args()
    print(f"{a.draws} draws per row, seeds {a.seed_base}..{a.seed_base + a.draws - 1}, bootstrap {a.bootstrap}, "
          f"R0 {a.r0}")
    print("| cut (x C_mid) | sd | flagged | 95% interval of A covers A | unflagged | unflagged missing A by > "
          f"{MARGIN} | unflagged covering A | median width (unflagged) |")
    print("|---|---|---|---|---|---|---|---|")
    for sd in map(float, a.sds.split(",")):
        for cut in map(float, a.cuts.split(",")):
            t0 = time.perf_counter()
            r = study(cut, sd, a.draws, a.seed_base, a.bootstrap, MARGIN, a.r0)
            n, u = r["draws"], r["unflagged"]
            width = f"{np.median(r['widths']):.3f}" if r["widths"] else "-"
            cov_u = f"{r['unflagged_covered']}/{u}" if u else "-"
            print(f"| {cut:g} | {sd:g} | {r['flagged']}/{n} | {r['covered']}/{n} ({r['covered'] / n:.1%}) | {u} | "
                  f"{r['unflagged_missed']}/{n} ({r['unflagged_missed'] / n:.1%}) | {cov_u} | {width} |"
                  f"  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
