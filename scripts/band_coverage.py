"""Extrapolate each run of the band fixture from its first half; print errors and band coverage.

    python scripts/band_coverage.py tests/data/real_runs.json [--fraction 0.5] [--json]
    python scripts/band_coverage.py tests/data/testbed_default_runs.json --fit-setup tiny-cpu

Each run is extrapolated as ``scalectl extrapolate RUN --fraction F`` does it: on
the recipe's fit axis, from the recipe's window start (else
:func:`scalectl.curve.default_min_compute`), with R0 measured at compute 0 and
weighted by that evaluation's standard error when the installed scalectl takes
one (``r0_se``), 1,000 bootstrap resamples, seed 0.  ``--fit-setup NAME`` fits every
run with the ``[fit]`` section of the packaged setup NAME instead of the one stored
with the run (its window start and its R0 rule, ``fit.r0``): the runs of a fixture
made before the setup's rule changed, fitted as ``scalectl extrapolate`` fits them
with today's recipe.  Only
``scalectl.science.extrapolate.extrapolate`` and ``scalectl.curve.default_min_compute``
are used, so the script also runs against an older checkout
(``PYTHONPATH=OLD/src python scripts/band_coverage.py ...``) to compare methods on
the same points.  Prints per run the held-out points inside the 95% prediction
band and the mean and max |error| of the prediction, then the totals.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
from pathlib import Path

import numpy as np

from scalectl.curve import default_min_compute
from scalectl.science.extrapolate import extrapolate


def setup_fit(name: str) -> dict:
    """The ``[fit]`` section of the packaged setup ``name`` (e.g. ``tiny-cpu``), as a dict."""
    from scalectl import presets
    from scalectl.recipe.load import read_toml

    return dict(read_toml(presets.packaged("setups", name)).get("fit") or {})


def run_inputs(run: dict, fit: dict | None = None) -> dict:
    """compute, pass_rate, truncation (n,) and the fit keywords the CLI would use for one run:
    with the run's own recipe ``fit`` section, or with ``fit`` when given (a setup's section).
    ``r0`` is the section's ``fit.r0`` (``auto`` when unset: R0 measured at compute 0)."""
    section = (run.get("fit") if fit is None else fit) or {}
    axis = section.get("axis", "gpu_hours")
    pts = [p for p in run["points"] if p.get(axis) is not None and p.get("pass_rate") is not None]
    x = np.array([float(p[axis]) for p in pts])
    y = np.array([float(p["pass_rate"]) for p in pts])
    t = np.array([np.nan if p.get("truncation_rate") is None else float(p["truncation_rate"])
                  for p in pts])
    if "min_compute" in section and section.get("axis", "gpu_hours") == axis:
        m = float(section["min_compute"])
    else:
        m = default_min_compute(x, axis)
    ses = [p["se"] for p in pts if p[axis] == 0 and p.get("se")]
    r0_se = math.sqrt(sum(s * s for s in ses) / len(ses)) if ses else None
    r0 = str(section.get("r0") or "auto")
    return {"x": x, "y": y, "truncation": t, "axis": axis, "min_compute": m, "r0_se": r0_se, "r0": r0,
            "truncation_threshold": section.get("truncation_threshold")}


def r0_keywords(d: dict, takes_se: bool = True) -> dict:
    """The R0 keywords of a fit of :func:`run_inputs`' ``d``: ``r0`` when the section's rule is not
    ``auto``, and the step-0 evaluation's ``r0_se`` (when there is one, the installed scalectl
    takes it, ``takes_se``, and R0 is not fitted)."""
    kw = {} if d["r0"] == "auto" else {"r0": d["r0"]}
    if takes_se and d["r0_se"] is not None and d["r0"] != "fit":
        kw["r0_se"] = d["r0_se"]
    return kw


def _takes_r0_se() -> bool:
    """Whether the installed scalectl's fit takes ``r0_se``: a field of
    ``scalectl.curve.FitSettings`` (the settings of ``fit_sigmoid``), or in older checkouts a
    keyword argument of ``fit_sigmoid`` itself."""
    import dataclasses

    from scalectl import curve

    settings = getattr(curve, "FitSettings", None)
    if settings is not None:
        return "r0_se" in {f.name for f in dataclasses.fields(settings)}
    return "r0_se" in inspect.signature(curve.fit_sigmoid).parameters


def coverage(data: dict, fraction: float = 0.5, bootstrap: int = 1000, fit: dict | None = None) -> dict:
    """Extrapolate every run of a fixture (the dict of its JSON) from ``fraction`` of its compute,
    each with its own recipe's ``fit`` section or with ``fit`` when given (:func:`run_inputs`).

    Returns {"inside", "held_out", "coverage", "mean_abs_error", "max_abs_error",
    "r0_se_used", "runs": [per run: run, inside, held_out, mean_abs_error,
    max_abs_error, mean_signed_error, A, flags, band_half_width]}; errors are pass-rate
    differences, measured minus predicted for the signed one.
    Raises what :func:`scalectl.science.extrapolate.extrapolate` raises for a run it cannot fit.
    """
    takes_se = _takes_r0_se()
    rows, inside, total, errors = [], 0, 0, []
    for run in data["runs"]:
        d = run_inputs(run, fit)
        kw = dict(min_compute=d["min_compute"], axis=d["axis"], bootstrap=bootstrap, seed=0,
                  truncation=d["truncation"], **r0_keywords(d, takes_se))
        ex = extrapolate(d["x"], d["y"], fraction=fraction, **kw)
        ok = (ex.heldout_pass_rate >= ex.band_lo) & (ex.heldout_pass_rate <= ex.band_hi)
        err = np.abs(ex.predicted - ex.heldout_pass_rate)
        inside += int(ok.sum())
        total += int(ok.size)
        errors.extend(err.tolist())
        rows.append({"run": run["name"], "inside": int(ok.sum()), "held_out": int(ok.size),
                     "mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
                     "mean_signed_error": float(np.mean(ex.heldout_pass_rate - ex.predicted)),
                     "A": ex.fit.A, "flags": [f.code for f in ex.fit.flags],
                     "band_half_width": float(np.mean(ex.band_hi - ex.band_lo) / 2)})
    return {"inside": inside, "held_out": total, "coverage": inside / total if total else None,
            "mean_abs_error": float(np.mean(errors)), "max_abs_error": float(np.max(errors)),
            "r0_se_used": takes_se, "runs": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixture")
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--fit-setup", metavar="NAME", help="fit with the [fit] section of this packaged setup "
                    "(e.g. tiny-cpu) instead of each run's own")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = ap.parse_args()
    fit = setup_fit(args.fit_setup) if args.fit_setup else None
    summary = coverage(json.loads(Path(args.fixture).read_text()), args.fraction, args.bootstrap, fit)
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    for r in summary["runs"]:
        flags = f" [{', '.join(r['flags'])}]" if r["flags"] else ""
        print(f"{r['run']}: {r['inside']}/{r['held_out']} inside, mean |error| {r['mean_abs_error']:.4f}, "
              f"max {r['max_abs_error']:.4f}, mean signed error {r['mean_signed_error']:+.4f}, "
              f"A {r['A']:.3f}{flags}, mean band half-width {r['band_half_width']:.4f}")
    print(f"all: {summary['inside']}/{summary['held_out']} = {summary['coverage']:.1%} inside the 95% "
          f"band, mean |error| {summary['mean_abs_error']:.4f}, max {summary['max_abs_error']:.4f}")


if __name__ == "__main__":
    main()
