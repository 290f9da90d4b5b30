"""The noise of stored runs, split as the simulated backend models it.

For each run: fit the sigmoid, take the residuals past step 0, and estimate

* eval_sd: the binomial sd of the evaluation from the stored per-prompt correct
  counts, sqrt(sum_i p_i (1 - p_i) / (k - 1)) / n for n prompts and k samples
  (p_i the share of prompt i's samples that are correct);
* corr_sd and corr_rho of an AR(1) part: var(residual) = corr_sd^2 + eval_sd^2
  and lag-one covariance = corr_rho corr_sd^2.

    .venv/bin/python scripts/noise_from_runs.py STORE.db [RUN ...]

Few points per run give rough estimates; the pooled line weights runs by points.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from scalectl.curve import FitError, fit_sigmoid
from scalectl.store import Store


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    store = Store.open(sys.argv[1], create=False)
    wanted = set(sys.argv[2:])
    pooled_var, pooled_cov, pooled_eval, n_res, n_cov = 0.0, 0.0, 0.0, 0, 0
    for run in store.list_runs():
        if wanted and run["name"] not in wanted:
            continue
        axis = (run.get("recipe") or {}).get("fit", {}).get("axis", "gpu_hours")
        pts = [p for p in store.points(run["id"]) if p.get(axis) is not None]
        if len(pts) < 6:
            continue
        x = np.array([p[axis] for p in pts], float)
        y = np.array([p["pass_rate"] for p in pts], float)
        try:
            fit = fit_sigmoid(x, y, axis=axis, bootstrap=0)
        except FitError as exc:
            print(f"{run['name']}: not fitted ({exc})")
            continue
        res = (y - fit.predict(x))[x > 0]
        evals = []
        for p in pts:
            cc, k = p.get("correct_counts"), p.get("samples_per_prompt")
            if cc and k and k > 1:
                q = np.asarray(cc, float) / k
                evals.append(math.sqrt(float(np.sum(q * (1 - q))) / (k - 1)) / len(q))
        eval_sd = float(np.mean(evals)) if evals else float("nan")
        var = float(np.mean(res ** 2))
        cov = float(np.mean(res[:-1] * res[1:])) if res.size > 2 else float("nan")
        corr2 = max(var - eval_sd ** 2, 0.0)
        rho = cov / corr2 if corr2 > 0 else float("nan")
        print(f"{run['name']}: {len(pts)} points to step {pts[-1]['step']}, A {fit.A:.3f}, reach "
              f"{x.max() / fit.C_mid:.1f} x C_mid; residual sd {math.sqrt(var):.4f}, lag-one cov {cov:.2e}, "
              f"eval_sd {eval_sd:.4f} -> corr_sd {math.sqrt(corr2):.4f}, corr_rho {rho:.2f}")
        pooled_var += var * res.size
        pooled_cov += cov * (res.size - 1) if res.size > 2 else 0.0
        pooled_eval += (eval_sd ** 2) * res.size if evals else 0.0
        n_res += res.size
        n_cov += res.size - 1 if res.size > 2 else 0
    if n_res:
        var, ev = pooled_var / n_res, pooled_eval / n_res
        corr2 = max(var - ev, 0.0)
        cov = pooled_cov / n_cov if n_cov else float("nan")
        print(f"pooled over {n_res} residuals: residual sd {math.sqrt(var):.4f}, eval_sd {math.sqrt(ev):.4f}, "
              f"corr_sd {math.sqrt(corr2):.4f}, corr_rho {cov / corr2 if corr2 > 0 else float('nan'):.2f}")


if __name__ == "__main__":
    main()
