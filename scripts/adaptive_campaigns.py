"""Wrong and undecided verdicts of ``ablate --until-decided`` on simulated campaigns.

Each campaign is a base curve and variants whose true ceilings differ from the
base's by the listed offsets, several of them near both edges of the margin
(+-0.02), simulated with the noise of :mod:`scalectl.curve.simulated` (seed
offset, correlated drift, evaluation noise at their defaults).  The adaptive
loop (:func:`scalectl.ablation.adaptive.run_loop`) runs with the command's
defaults (level 0.99, at most 6 seeds, at most 8 x the first budget, 1,000
bootstrap resamples unless ``--bootstrap``), starting at 1 x C_mid, once per
noise seed (arm seeds start at ``1000 x noise seed``).  A verdict is wrong when
it claims what the truth is not (:func:`scalectl.ablation.decisions.is_true_verdict`:
higher needs a true dA >= margin, a tie |dA| < margin).

    PYTHONPATH=src nice -n 10 .venv/bin/python scripts/adaptive_campaigns.py \\
        [--campaigns report] [--noise-seeds 0,1,2] [--bootstrap 1000]

``--campaigns development`` are the ones the rules were checked on while they were
chosen (an earlier report's campaign and ``scripts/adaptive_vs_fixed.py``'s);
``report`` are the ones docs/ablations.md quotes, not used to choose anything.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from scalectl.ablation.adaptive import SimBackend, initial_state, run_loop
from scalectl.ablation.decisions import Limits, is_true_verdict
from scalectl.curve.simulated import SimCurve
from scalectl.defaults import MARGIN

#: name -> (base curve, offsets of the variants' ceilings, first budget in steps)
CAMPAIGNS = {
    "development": {
        "low-ceiling": (SimCurve(A=0.45, B=1.5, C_mid=0.1, R0=0.30),
                        (-0.09, -0.06, -0.04, -0.025, -0.022, -0.018, -0.015, -0.01, 0.0, 0.005,
                         0.015, 0.022, 0.03, 0.06), 100),
        "adaptive-vs-fixed": (SimCurve(A=0.60, B=2.0, C_mid=0.1, R0=0.30),
                              (-0.08, -0.07, -0.06, -0.05, -0.045, -0.04, -0.035, -0.03, -0.01, -0.005,
                               0.0, 0.005, 0.01, 0.03, 0.035, 0.04, 0.05, 0.06, 0.07, 0.08), 100),
    },
    "report": {
        "slow-rise": (SimCurve(A=0.70, B=1.2, C_mid=0.2, R0=0.25, hours_per_step=0.002),
                      (-0.06, -0.035, -0.026, -0.023, -0.017, -0.014, -0.008, 0.0, 0.007, 0.013,
                       0.016, 0.019, 0.021, 0.024, 0.028, 0.05), 100),
        "steep-late": (SimCurve(A=0.52, B=2.6, C_mid=0.3, R0=0.35, hours_per_step=0.003),
                       (-0.05, -0.029, -0.024, -0.021, -0.019, -0.016, -0.011, -0.004, 0.003, 0.012,
                        0.017, 0.02, 0.023, 0.027, 0.045), 100),
    },
}


def campaign_arms(base: SimCurve, offsets) -> dict[str, tuple[SimCurve, float]]:
    """The base and one variant per offset: name -> (curve, true dA)."""
    out = {"base": (base, 0.0)}
    for i, d in enumerate(offsets):
        out[f"v{i:02d}{d:+.3f}"] = (replace(base, A=round(base.A + d, 4)), d)
    return out


def run_campaign(base: SimCurve, offsets, initial: int, noise_seed: int, bootstrap: int):
    """One loop over a campaign: (rows of (variant, true dA, verdict, right), device-hours, stages)."""
    arms = campaign_arms(base, offsets)
    curves = {n: c for n, (c, _) in arms.items()}
    backend = SimBackend(curves, every=10, seed0=1000 * noise_seed)
    limits = Limits(max_budget=8 * initial, max_seeds=6, step_multiple=10)
    res = run_loop(backend, initial_state(list(curves), "base", initial), limits,
                   fit_kw={"bootstrap": bootstrap, "level": 0.99})
    rows = []
    for n, (_, d) in arms.items():
        if n == "base":
            continue
        v = res.decisions[n].verdict
        rows.append((n, d, v, is_true_verdict(v, d, MARGIN)))
    return rows, res.spent_hours, len(res.stages)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--campaigns", choices=sorted(CAMPAIGNS), default="report")
    p.add_argument("--noise-seeds", default="0,1,2")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--only", default=None, help="run only this campaign of the set")
    p.add_argument("--verbose", action="store_true", help="print every variant's verdict")
    a = p.parse_args()
    total = {"variants": 0, "wrong": 0, "undecided": 0, "right": 0}
    print("| campaign | noise seed | variants | right | wrong | undecided | device-hours | stages |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (base, offsets, initial) in CAMPAIGNS[a.campaigns].items():
        if a.only and name != a.only:
            continue
        for seed in map(int, a.noise_seeds.split(",")):
            t0 = time.perf_counter()
            rows, hours, stages = run_campaign(base, offsets, initial, seed, a.bootstrap)
            right = sum(r[3] is True for r in rows)
            wrong = sum(r[3] is False for r in rows)
            undecided = sum(r[3] is None for r in rows)
            for k, v in (("variants", len(rows)), ("wrong", wrong), ("undecided", undecided), ("right", right)):
                total[k] += v
            print(f"| {name} | {seed} | {len(rows)} | {right} | {wrong} | {undecided} | {hours:.2f} | {stages} |"
                  f"  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)
            if a.verbose or wrong:
                for n, d, v, ok in rows:
                    mark = {True: "right", False: "WRONG", None: "-"}[ok]
                    print(f"    {n} true dA {d:+.3f}: {v} ({mark})", flush=True)
    print(f"in all: {total['variants']} verdicts, {total['right']} right, {total['wrong']} wrong "
          f"({total['wrong'] / max(total['variants'], 1):.1%}), {total['undecided']} undecided")


if __name__ == "__main__":
    main()
