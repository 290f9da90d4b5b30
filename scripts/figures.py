"""Draw one example of every figure scalectl writes into docs/figures/ (or OUT_DIR).

    python scripts/figures.py [OUT_DIR]

From runs that need no training, so that the examples can be made again at any time:

* ``fit.png``, ``compare.png``, ``loo.png``: the real tiny-setup runs of
  ``tests/data/real_runs.json`` (scalerl, dapo and grpo, seed 0, 400 steps on FLOPs),
  fitted as ``scalectl fit`` / ``compare`` fit them (the recipes' window from compute 0,
  1000 bootstrap resamples);
* ``extrapolate.png``: a simulated run (``scalectl.curve.simulated``, the default curve:
  A 0.60, B 2, C_mid 0.1 device-hours) of 500 steps, fitted to half its compute;
* ``report-curves.png``, ``report-loo.png``, ``report-truncation.png``: the report of a
  leave-one-out ablation whose runs are simulated curves with truncation rates, imported
  into a store in a temporary folder (``scalectl report``'s figures).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def real_curves(names=("scalerl-s0", "dapo-s0", "grpo-s0")) -> dict:
    """Name -> RunCurve of the real tiny runs, fitted on FLOPs from compute 0."""
    from scalectl.curve import fit_sigmoid
    from scalectl.science.compare import RunCurve

    runs = {r["name"]: r for r in json.loads((ROOT / "tests/data/real_runs.json").read_text())["runs"]}
    out = {}
    for name in names:
        pts = runs[name]["points"]
        x = np.array([p["flops"] for p in pts], dtype=float)
        y = np.array([p["pass_rate"] for p in pts], dtype=float)
        out[name] = RunCurve(x, y, fit_sigmoid(x, y, min_compute=0.0, axis="flops", bootstrap=1000, seed=0),
                             hardware="cpu-2core")
    return out


def simulated_points(spec: str, steps: int, every: int = 10, seed: int = 0) -> list[dict]:
    """The evaluation points a simulated run of ``spec`` draws to ``steps``."""
    from scalectl.curve.simulated import draw_points, eval_steps, parse_spec

    return draw_points(parse_spec(spec), seed, eval_steps(steps, every))


def extrapolate_example(out: Path) -> Path:
    from scalectl.present.plot import plot_extrapolation
    from scalectl.science.extrapolate import extrapolate

    pts = simulated_points("simulated:A=0.6,B=2,C_mid=0.1", 500)
    x = np.array([p["gpu_hours"] for p in pts])
    y = np.array([p["pass_rate"] for p in pts])
    ex = extrapolate(x, y, fraction=0.5, min_compute=0.0, bootstrap=1000, seed=0)
    keep = x <= ex.cut
    return plot_extrapolation(ex, out / "extrapolate.png", name="sim-s0", fitted_compute=x[keep],
                              fitted_pass_rate=y[keep])


def report_examples(out: Path) -> list[Path]:
    """The three figures of the report of simulated leave-one-out runs imported into a store."""
    from scalectl.ablation.report import build_report
    from scalectl.store.importer import import_points
    from scalectl.store.database import Store

    curves = {"base": ("A=0.61,B=2.0", 0.04), "loo-fp32": ("A=0.55,B=2.0", 0.05),
              "loo-plan": ("A=0.61,B=1.4", 0.04), "loo-lp": ("A=0.60,B=2.0", 0.14)}
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "s.db"
        with Store.open(db) as store:
            for i, (variant, (spec, trunc_end)) in enumerate(curves.items()):
                pts = simulated_points(f"simulated:{spec},C_mid=0.1", 500, seed=i)
                csv = Path(tmp) / f"{variant}.csv"
                t = trunc_end * np.linspace(0.2, 1.0, len(pts))
                csv.write_text("step,gpu_hours,pass_rate,truncation_rate\n" + "".join(
                    f"{p['step']},{p['gpu_hours']:.5f},{p['pass_rate']:.5f},{ti:.4f}\n" for p, ti in zip(pts, t)))
                import_points(store, csv, f"scalerl-loo--{variant}--s0")
        manifest = {"name": "scalerl-loo", "kind": "leave_one_out", "baseline": "base", "margin": 0.02,
                    "variants": [{"name": v, "is_base": v == "base", "lead": "", "changes": [],
                                  "runs": [f"scalerl-loo--{v}--s0"]} for v in curves]}
        _, files = build_report(str(db), manifest, Path(tmp) / "report", bootstrap=1000)
        for kind in ("curves", "loo", "truncation"):
            written.append(Path(shutil.copy(files[kind], out / f"report-{kind}.png")))
    return written


def main(argv: list[str]) -> None:
    from scalectl.present.plot import plot_curves, plot_loo
    from scalectl.science.compare import loo_lines

    out = Path(argv[0]) if argv else ROOT / "docs" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    real = real_curves()
    written = [plot_curves({"scalerl-s0": real["scalerl-s0"]}, out / "fit.png", baseline="scalerl-s0"),
               plot_curves(real, out / "compare.png", baseline="scalerl-s0"),
               plot_loo(loo_lines(real), out / "loo.png", axis="flops",
                        fits={n: c.fit for n, c in real.items()}),
               extrapolate_example(out), *report_examples(out)]
    for path in written:
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
