"""The noise of stored runs, split as the simulated backend models it.

For each run: fit the sigmoid, take the residuals past step 0, and estimate

* eval_sd: the binomial sd of the evaluation from the stored per-prompt correct
  counts, sqrt(sum_i p_i (1 - p_i) / (k - 1)) / n for n prompts and k samples
  (p_i the share of prompt i's samples that are correct);
* corr_sd and corr_rho of an AR(1) part: var(residual) = corr_sd^2 + eval_sd^2
  and lag-one covariance = corr_rho corr_sd^2.

* from seeds of one recipe (runs sharing a recipe hash), without any fit: the
  difference d = y_a - y_b of two seeds at the same steps (step 0, the shared warm
  start, left out) holds no mean curve.  Centred, var(d) = 2 corr_sd^2 + the two
  evaluations' variances, and its lag-one covariance is 2 corr_rho corr_sd^2 (the
  evaluation noise is independent from point to point); mean(d) is the level
  offset between the two seeds, whose sd over pairs / sqrt(2) bounds the seed
  part (it also holds the correlated and evaluation noise averaged over the run).

    .venv/bin/python scripts/noise_from_runs.py STORE.db [RUN ...]

Few points per run give rough estimates; the pooled line weights runs by points.
Residuals of a fitted curve understate the correlated part (the fit absorbs some
of it); the seed differences do not, but need two or more seeds of a recipe.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from scalectl.curve import FitError, fit_sigmoid
from scalectl.store.database import Store


def eval_var(point: dict) -> float | None:
    """Unbiased variance of one mean@k evaluation from its per-prompt correct counts:
    sum_i p_i (1 - p_i) / (k - 1) / n^2, or None without counts (or k < 2)."""
    cc, k = point.get("correct_counts"), point.get("samples_per_prompt")
    if not cc or not k or k < 2:
        return None
    q = np.asarray(cc, float) / k
    return float(np.sum(q * (1 - q))) / (k - 1) / len(q) ** 2


def seed_pairs(store: Store, runs: list[dict]) -> list[dict]:
    """Per pair of runs with one recipe hash: n common steps past 0, mean difference,
    per-run correlated variance and lag-one covariance (see the module docstring)."""
    by_hash: dict[str, list[dict]] = {}
    for run in runs:
        if run.get("recipe_hash"):
            by_hash.setdefault(run["recipe_hash"], []).append(run)
    out = []
    for group in by_hash.values():
        pts = {r["name"]: {p["step"]: p for p in store.points(r["id"]) if p["step"] > 0} for r in group}
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                steps = sorted(set(pts[a["name"]]) & set(pts[b["name"]]))
                pa, pb = [pts[a["name"]][s] for s in steps], [pts[b["name"]][s] for s in steps]
                ev = [(eval_var(x), eval_var(y)) for x, y in zip(pa, pb)]
                if len(steps) < 6 or any(u is None or v is None for u, v in ev):
                    continue
                d = np.array([x["pass_rate"] - y["pass_rate"] for x, y in zip(pa, pb)])
                c = d - d.mean()
                e2 = float(np.mean([u + v for u, v in ev]))
                out.append({"pair": (a["name"], b["name"]), "n": len(steps), "offset": float(d.mean()),
                            "corr2": (float(np.mean(c ** 2)) - e2) / 2,
                            "cov1": float(np.mean(c[1:] * c[:-1])) / 2, "eval_sd": math.sqrt(e2 / 2)})
    return out


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    store = Store.open(sys.argv[1], create=False)
    wanted = set(sys.argv[2:])
    pooled_var, pooled_cov, pooled_eval, n_res, n_cov = 0.0, 0.0, 0.0, 0, 0
    runs = [r for r in store.list_runs() if not wanted or r["name"] in wanted]
    for run in runs:
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
    pairs = seed_pairs(store, runs)
    for p in pairs:
        print(f"seeds {p['pair'][0]} - {p['pair'][1]}: {p['n']} steps, mean difference {p['offset']:+.4f}, "
              f"eval_sd {p['eval_sd']:.4f}, corr_sd {math.sqrt(max(p['corr2'], 0)):.4f}, lag-one cov "
              f"{p['cov1']:.2e}")
    if pairs:
        corr2 = float(np.mean([p["corr2"] for p in pairs]))
        cov1 = float(np.mean([p["cov1"] for p in pairs]))
        level = math.sqrt(float(np.mean([p["offset"] ** 2 for p in pairs])) / 2)
        print(f"pooled over {len(pairs)} seed pairs: corr_sd {math.sqrt(max(corr2, 0)):.4f}, corr_rho "
              f"{cov1 / corr2 if corr2 > 0 else float('nan'):.2f}, level offset sd per run {level:.4f}")


if __name__ == "__main__":
    main()
