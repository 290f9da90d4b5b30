"""Check `scalectl forecast` where the answer is known: simulated curves, and real runs' last points.

    python scripts/forecast_check.py [--draws 1000] [--json]
    python scripts/forecast_check.py --skip-simulated tests/data/real_runs.json tests/data/testbed_long_runs.json
    python scripts/forecast_check.py --skip-simulated --fit-setup tiny-cpu tests/data/testbed_default_runs.json

1. Simulated curves (eq. 1 of Khatri et al. 2025 with known A, B, C_mid, R0, and independent
   evaluation noise): each draw is fitted up to ``reach`` x C_mid (41 points) with 300 bootstrap
   resamples; the 95 % band (:func:`scalectl.science.forecast.pass_rate_at`, drift sd 0: the
   simulated runs do not drift) is scored on a new point drawn with the same noise at 2x, 4x and
   10x the last fitted compute, and the interval of the compute to reach a target
   (:func:`scalectl.science.forecast.reach`) on the true compute.  Prints the share covered
   (95 % expected; a share of n draws has sd sqrt(0.95 x 0.05 / n)).
2. Real runs (band fixtures of the project, ``tests/data/*.json``): each run fitted from its first
   quarter and its first half of compute as ``scalectl forecast`` fits a run (the recipe's axis and
   window, R0 measured at compute 0 with its standard error, 1,000 resamples, seed 0, drift sd
   0.01; with ``--fit-setup NAME`` the window and R0 rule of the packaged setup's ``[fit]``),
   and the forecast at its last point's compute scored against the mean of its last three
   evaluations (a point's own evaluation noise is in the band; the mean is what the curve
   predicts).  Prints per run the forecast, its band, the measured value and the error.

Nothing is timed: the figures are of calibration, not speed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from band_coverage import r0_keywords, run_inputs, setup_fit  # noqa: E402  (a script beside this one)

from scalectl.curve import fit_sigmoid, sigmoid  # noqa: E402
from scalectl.science.forecast import compute_to_reach, pass_rate_at, reach  # noqa: E402

#: The simulated settings: (A, B, C_mid, R0, evaluation sd, fitted up to reach x C_mid, target).
SETTINGS = (
    (0.65, 1.5, 1000.0, 0.3, 0.01, 3.0, 0.60),
    (0.65, 1.5, 1000.0, 0.3, 0.01, 5.0, 0.62),
    (0.61, 1.7, 10_909.0, 0.3, 0.005, 2.5, 0.58),
)
MULTIPLES = (2.0, 4.0, 10.0)


def simulated(draws: int, settings=SETTINGS) -> list[dict]:
    """Coverage of the band at each multiple and of the compute-to-target interval, per setting."""
    rows = []
    for A, B, C_mid, R0, sd, reach_x, target in settings:
        x = np.linspace(0.0, reach_x * C_mid, 41)
        at = np.array(MULTIPLES) * x[-1]
        truth_at = sigmoid(at, A, B, C_mid, R0)
        true_c = float(compute_to_reach(target, A, B, C_mid, R0))
        inside, covered = np.zeros(len(MULTIPLES)), 0
        for i in range(draws):
            rng = np.random.default_rng(10_000 + i)
            fit = fit_sigmoid(x, sigmoid(x, A, B, C_mid, R0) + rng.normal(0, sd, x.size), bootstrap=300, seed=i)
            fc = pass_rate_at(fit, at, last=x[-1], drift_sd=0.0, seed=i)
            new = truth_at + rng.normal(0, sd, at.size)
            inside += [f.lo <= v <= f.hi for f, v in zip(fc, new)]
            r = reach(fit, target, last=x[-1])
            covered += r.lo <= true_c <= r.hi
        rows.append({"A": A, "B": B, "C_mid": C_mid, "R0": R0, "sd": sd, "reach": reach_x, "target": target,
                     "draws": draws, "band_coverage": dict(zip((f"{m:g}x" for m in MULTIPLES), inside / draws)),
                     "reach_coverage": covered / draws, "share_sd": math.sqrt(0.95 * 0.05 / draws)})
    return rows


def real(fixture: Path, fractions=(0.25, 0.5), section: dict | None = None) -> list[dict]:
    """The forecast of each run's last point from its first quarter and half (see the module doc),
    each run fitted with its own recipe's ``fit`` section or with ``section`` when given."""
    rows = []
    for run in json.loads(fixture.read_text())["runs"]:
        d = run_inputs(run, section)
        x, y = d["x"], d["y"]
        order = np.argsort(x, kind="stable")
        x, y, t = x[order], y[order], d["truncation"][order]
        last = float(x[-1])
        measured = float(np.mean(y[-3:]))
        for fraction in fractions:
            keep = x <= fraction * last
            kw = dict(min_compute=d["min_compute"], axis=d["axis"], bootstrap=1000, seed=0,
                      truncation=t[keep], truncation_threshold=float(d["truncation_threshold"] or 0.1),
                      **r0_keywords(d))
            row = {"fixture": fixture.name, "run": run["name"], "fraction": fraction, "axis": d["axis"],
                   "last": last, "measured": measured}
            try:
                fit = fit_sigmoid(x[keep], y[keep], **kw)
            except ValueError as exc:
                rows.append(row | {"error": str(exc)})
                continue
            (f,) = pass_rate_at(fit, [last], last=float(x[keep][-1]))
            rows.append(row | {"A": fit.A, "flags": list(fit.flag_codes), "predicted": f.predicted,
                               "band": [f.lo, f.hi], "error": f.predicted - measured,
                               "inside": bool(f.lo <= measured <= f.hi)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures", nargs="*", type=Path, help="band fixtures (default: tests/data/real_runs.json "
                                                            "and tests/data/testbed_long_runs.json)")
    ap.add_argument("--draws", type=int, default=1000, help="simulated draws per setting (default 1,000)")
    ap.add_argument("--skip-simulated", action="store_true")
    ap.add_argument("--fit-setup", metavar="NAME", help="fit the real runs with the [fit] section of this "
                    "packaged setup (e.g. tiny-cpu) instead of each run's own")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent / "tests" / "data"
    fixtures = args.fixtures or [root / "real_runs.json", root / "testbed_long_runs.json"]
    sims = [] if args.skip_simulated else simulated(args.draws)
    section = setup_fit(args.fit_setup) if args.fit_setup else None
    reals = [r for f in fixtures for r in real(f, section=section)]
    if args.json:
        print(json.dumps({"simulated": sims, "real": reals}, indent=1))
        return
    for s in sims:
        cov = ", ".join(f"{k} {v:.1%}" for k, v in s["band_coverage"].items())
        print(f"simulated A {s['A']} B {s['B']} C_mid {s['C_mid']:g} sd {s['sd']} fitted to {s['reach']:g} x C_mid, "
              f"{s['draws']} draws: band covers {cov}; compute to {s['target']} covered {s['reach_coverage']:.1%} "
              f"(a share's sd {s['share_sd']:.1%})")
    for r in reals:
        head = f"{r['fixture']} {r['run']} from {r['fraction']:.0%}:"
        if "predicted" not in r:
            print(f"{head} not fitted: {r['error']}")
            continue
        flags = f" [{', '.join(r['flags'])}]" if r["flags"] else ""
        print(f"{head} A {r['A']:.3f}{flags}, at the last point ({r['last']:.3g} {r['axis']}) {r['predicted']:.3f} "
              f"[{r['band'][0]:.3f}, {r['band'][1]:.3f}], measured {r['measured']:.3f} (mean of the last 3), "
              f"error {r['error']:+.3f}, {'inside' if r['inside'] else 'OUTSIDE'}")


if __name__ == "__main__":
    main()
