"""What the fit needs from the held-out evaluation: the ceiling's interval and identification
against the evaluation's cost, measured on stored runs by thinning their own evaluations.

Every stored point holds its prompts' correct counts (``correct_counts``, one per held-out
prompt, out of ``samples_per_prompt``), so a cheaper schedule can be read off a run already
made, without training again: every m-th point (``every``), the first n prompts (``prompts``,
the held-out set is fixed), and k' of the k samples of each prompt (``samples``, drawn without
replacement: a hypergeometric draw of the correct ones).  Each thinned run is fitted as
``scalectl fit`` fits a stored run (its axis and window, bootstrap intervals, the compute-0
point's standard error) and scored as the testbed scores a default run: identified when no
flag is raised and the A interval is at most 0.04 wide.

    python scripts/eval_schedule.py --db build/testbed/testbed.db long-s0 long-s1 long-s2 --until-step 750

Also printed per run: the fit's residual sd beside the evaluation's own sampling error (the
binomial error of the mean over the prompts, ``scalectl.curve.evaluation_standard_error``):
when the residuals are much larger, the points' noise is the run's own and more samples per
evaluation buy little.  Not a test: it prints what it measured, with the CPU kind and load.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WIDTH_TARGET = 0.04


def thinned(points: list[dict], every: int, prompts: int, samples: int, rng) -> list[tuple[dict, np.ndarray, int]]:
    """A run's points under a cheaper evaluation: every ``every``-th point (the first, at compute
    0, kept), the first ``prompts`` prompts, ``samples`` of each prompt's k samples drawn without
    replacement.  Returns (point, correct counts kept (n,), samples per prompt kept) per point."""
    out = []
    for p in points[::every]:
        c = np.asarray(p["correct_counts"][:prompts], dtype=int)
        k = int(p["samples_per_prompt"])
        out.append((p, c, k) if samples >= k else (p, rng.hypergeometric(c, k - c, samples), samples))
    return out


def fit_thinned(kept: list[tuple[dict, np.ndarray, int]], axis: str, min_compute: float, threshold: float,
                bootstrap: int, seed: int):
    """The fit of a thinned run with ``scalectl fit``'s settings for a stored run: its axis and
    window, truncation flag, bootstrap intervals and the compute-0 evaluation's standard error."""
    from scalectl.curve import evaluation_standard_error, fit_sigmoid

    x = np.asarray([p[axis] for p, _, _ in kept], dtype=float)
    y = np.asarray([c.sum() / (c.size * k) for _, c, k in kept])
    trunc = np.asarray([p.get("truncation_rate") or 0.0 for p, _, _ in kept], dtype=float)
    zero = [(c, k) for p, c, k in kept if p[axis] == 0]
    r0_se = evaluation_standard_error(zero[0][0].tolist(), zero[0][1]) if zero else None
    return fit_sigmoid(x, y, min_compute=min_compute, axis=axis, bootstrap=bootstrap, seed=seed,
                       truncation=trunc, truncation_threshold=threshold, r0_se=r0_se)


def load_run(db: str, name: str, until_step: int | None) -> tuple[list[dict], dict]:
    """A run's points (up to ``until_step``) and its recipe, from the store."""
    from scalectl.store.database import Store

    with Store.open(db, create=False) as store:
        run = store.get_run(name)
    show = json.loads(_scalectl("show", name, "--db", db, "--json"))
    points = [p for p in show["points"] if until_step is None or p["step"] <= until_step]
    return points, run.get("recipe") or {}


def _scalectl(*args: str) -> str:
    import subprocess

    exe = str(Path(sys.executable).parent / "scalectl")
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--db", default="build/testbed/testbed.db")
    parser.add_argument("--until-step", type=int, default=None, help="read each run up to this step")
    parser.add_argument("--every", default="1,2,3", help="keep every m-th point (comma list)")
    parser.add_argument("--prompts", default="500,250", help="held-out prompts kept (comma list)")
    parser.add_argument("--samples", default="8,4", help="samples per prompt kept (comma list)")
    parser.add_argument("--draws", type=int, default=3, help="thinnings per setting (sampling is random)")
    parser.add_argument("--bootstrap", type=int, default=300)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import cpu_model

    from scalectl.curve import evaluation_standard_error

    print(f"machine: {cpu_model()}, load {os.getloadavg()[0]:.1f}")
    settings = list(itertools.product(*(sorted({int(v) for v in s.split(",")}, reverse=(i > 0))
                                        for i, s in enumerate((args.every, args.prompts, args.samples)))))
    rows = []
    for name in args.runs:
        points, recipe = load_run(args.db, name, args.until_step)
        fit_cfg = recipe.get("fit") or {}
        axis = fit_cfg.get("axis", "flops")
        min_c = float(fit_cfg.get("min_compute") or 0.0)
        threshold = float(fit_cfg.get("truncation_threshold", 0.4))
        every_steps = recipe["eval"]["every_steps"]
        train_rows = recipe["batch"]["prompts_per_step"] * recipe["batch"]["generations_per_prompt"]
        n_all, k_all = len(points[0]["correct_counts"]), int(points[0]["samples_per_prompt"])
        full = fit_thinned(thinned(points, 1, n_all, k_all, None), axis, min_c, threshold, args.bootstrap, 0)
        ses = [evaluation_standard_error(p["correct_counts"], p["samples_per_prompt"]) for p in points]
        print(f"\n{name}: {len(points)} points to step {points[-1]['step']}, a point every {every_steps} steps; "
              f"whole fit A {full.A:.3f} [{full.intervals['A'][0]:.3f}, {full.intervals['A'][1]:.3f}]; "
              f"residual sd {full.rmse:.4f} vs the evaluation's sampling error "
              f"{np.sqrt(np.mean(np.square(ses))):.4f} ({n_all} x {k_all})")
        print(f"  {'every':>5} {'prompts':>7} {'k':>2} {'eval/train':>10} {'A mean':>7} {'A sd':>6} {'width':>6} "
              f"{'identified':>10}")
        for m, n, k in settings:
            rng = np.random.default_rng([m, n, k, sum(map(ord, name))])
            draws = 1 if k >= k_all else args.draws      # fewer prompts alone: the first n, no draw
            fits = [fit_thinned(thinned(points, m, n, k, rng), axis, min_c, threshold, args.bootstrap, d)
                    for d in range(draws)]
            widths = [f.intervals["A"][1] - f.intervals["A"][0] for f in fits]
            ok = sum(1 for f, w in zip(fits, widths) if not f.flags and w <= WIDTH_TARGET)
            cost = min(n, n_all) * min(k, k_all) / (m * every_steps) / train_rows
            a = [f.A for f in fits]
            row = {"run": name, "m": m, "every": m * every_steps, "prompts": n, "samples": k,
                   "eval_per_train": cost, "A_mean": float(np.mean(a)), "A_sd": float(np.std(a)),
                   "width": float(np.mean(widths)), "identified": ok, "draws": len(fits),
                   "full": n >= n_all and k >= k_all}
            rows.append(row)
            print(f"  {row['every']:>5} {n:>7} {k:>2} {cost:>10.2f} {row['A_mean']:>7.3f} {row['A_sd']:>6.3f} "
                  f"{row['width']:>6.3f} {ok:>6}/{len(fits)}", flush=True)
    print("\nover the runs (mean width, identified of all draws):")
    for m, n, k in settings:
        sel = [r for r in rows if (r["m"], r["prompts"], r["samples"]) == (m, n, k)]
        print(f"  every {sel[0]['every']:>3} steps, {n} x {k}: eval/train {sel[0]['eval_per_train']:.2f}, "
              f"A sd over draws {np.mean([r['A_sd'] for r in sel]):.3f}, width {np.mean([r['width'] for r in sel]):.3f}, "
              f"identified {sum(r['identified'] for r in sel)}/{sum(r['draws'] for r in sel)}")

    scaling(rows)


def scaling(rows: list[dict]) -> None:
    """How the A interval's width scales with the evaluation's size (prompts x samples, a point
    at every evaluation kept): the least-squares slope of log(width / the run's full-evaluation
    width) on log(size / full size) over the settings and runs measured, and the width that
    slope gives at twice and four times the full evaluation (an extrapolation: a width of pure
    sampling noise would have slope -1/2)."""
    full = [r for r in rows if r["m"] == 1]
    base = {r["run"]: r for r in full if r["full"]}
    pts = [(r["prompts"] * r["samples"] / (base[r["run"]]["prompts"] * base[r["run"]]["samples"]),
            r["width"] / base[r["run"]]["width"]) for r in full if r["run"] in base and not r["full"]]
    if len(pts) < 2:
        return
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    slope = float(np.sum(x * y) / np.sum(x * x))          # through the full evaluation (0, 0)
    w = float(np.mean([b["width"] for b in base.values()]))
    print(f"\nwidth vs evaluation size (a point every evaluation, {len(pts)} thinned fits against their run's "
          f"full one): slope {slope:+.2f} (sampling noise alone: -0.50); mean full width {w:.3f}, "
          f"at 2 x the evaluation {w * 2 ** slope:.3f}, at 4 x {w * 4 ** slope:.3f}")


if __name__ == "__main__":
    main()
