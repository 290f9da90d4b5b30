"""``scalectl fit``, ``compare`` and ``extrapolate``: the scaling-curve science.

Thin commands over :mod:`scalectl.curve`, :mod:`scalectl.compare`,
:mod:`scalectl.extrapolate` and :mod:`scalectl.plot`.  Fits are kept in the
store's ``fits`` table under a key naming the axis, method, window and
bootstrap settings, with the digest of the points they used: a fit is
recomputed only when the points (or the settings) change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.common import DbOption, JsonOption, err, open_store, out, print_json, user_errors
from scalectl.defaults import MARGIN
from scalectl.errors import UserError
from scalectl.fit_tables import compare_table, extrapolation_lines, fit_table, sensitivity_table
from scalectl.run_fits import (FitOptions, fit_run, fit_section, fit_window, load_points, parse_r0, r0_standard_error,
                               resolve_axis)


AxisOption = Annotated[str | None, typer.Option(
    "--axis", help="Compute axis: gpu_hours, flops, tokens or step (default: the run's recipe "
                   "fit.axis, else gpu_hours).")]
MinComputeOption = Annotated[float | None, typer.Option(
    "--min-compute", help="Fit window start, in axis units (default: the recipe's fit.min_compute "
                          "on its own axis, else 1500 GPU-hours at paper scale or 1.5% of the run).")]
MethodOption = Annotated[str, typer.Option(
    "--method", help="vp (bounded least squares from a variable-projection start) or grid "
                     "(the paper's A.5 grid).")]
R0Option = Annotated[str, typer.Option(
    "--r0", help="auto (measured at compute 0 if there, else fitted), measured, fit, or a number.")]
BootstrapOption = Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples (0: none).")]
LevelOption = Annotated[float, typer.Option("--level", help="Interval level.")]
SeedOption = Annotated[int, typer.Option("--seed", help="Bootstrap seed.")]
MarginOption = Annotated[float, typer.Option("--margin", help="Noise margin on A (paper: 0.02).")]
PlotOption = Annotated[Path | None, typer.Option("--plot", help="Write a figure (.png or .svg).")]


def _flag_lines(name: str, fit) -> None:
    for f in fit.flags:
        out.print(f"[yellow]{name}[/yellow] {f.code}: {f.message}", soft_wrap=True)


# ----------------------------------------------------------------------------- fit


@user_errors
def fit(
    runs: Annotated[list[str], typer.Argument(help="Run names or ids.")],
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    method: MethodOption = "vp",
    r0: R0Option = "auto",
    bootstrap: BootstrapOption = 1000,
    level: LevelOption = 0.95,
    seed: SeedOption = 0,
    margin: MarginOption = MARGIN,
    refit: Annotated[bool, typer.Option("--refit", help="Recompute even if stored.")] = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Draw the points, fitted curves, ceilings with their intervals and the "
                       "margin band around the first run's ceiling (.png or .svg).")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Fit R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to each run and store the fits."""
    from scalectl.curve import advise, seed_spread

    opts = FitOptions(axis, min_compute, method, r0, bootstrap, level, seed)
    results, curves = [], {}
    with open_store(db) as store:
        for ref in runs:
            run = store.get_run(ref)
            curve, cached, key = fit_run(store, run, opts, refit=refit)
            advice = advise(curve.fit, margin) if curve.fit.interval("A") else None
            results.append((run, curve.fit, cached, key, advice))
            curves[run["name"]] = curve
    written = None
    if plot is not None:
        from scalectl.plot import plot_curves

        written = str(_plot(plot_curves, curves, plot, baseline=next(iter(curves)), margin=margin))
    by_hash: dict[str, list] = {}
    for run, f, *_ in results:
        if run.get("recipe_hash"):
            by_hash.setdefault(run["recipe_hash"], []).append(f)
    spreads = {h: seed_spread(fs) for h, fs in by_hash.items() if len(fs) > 1}
    if json_:
        print_json({
            "fits": [{"run": r["name"], "run_id": r["id"], "key": k, "cached": c, "fit": f.to_dict(),
                      "advice": None if a is None else {"action": a.action, "message": a.message,
                                                        "seeds_needed": a.seeds_needed}}
                     for r, f, c, k, a in results],
            "seed_spread": {h: {n: vars(s) for n, s in sp.items()} for h, sp in spreads.items()},
            "plot": written,
        })
        return
    axes = sorted({f.axis for _, f, *_ in results})
    out.print(fit_table([(run["name"] + (" (stored)" if cached else ""), f)
                         for run, f, cached, _, _ in results], axes, out.width))
    for run, f, _, _, advice in results:
        _flag_lines(run["name"], f)
        if advice is not None and advice.action != "none":
            out.print(f"[cyan]{run['name']}[/cyan] {advice.message}", soft_wrap=True)
    for h, sp in spreads.items():
        a, b = sp["A"], sp["B"]
        out.print(f"recipe {h}: {a.n} runs, A {a.mean:.3f} +- {a.sd:.3f} (range {a.min:.3f}-"
                  f"{a.max:.3f}), B {b.mean:.2f} +- {b.sd:.2f}")
    if written:
        err.print(f"wrote {written}")



# ----------------------------------------------------------------------------- compare


@user_errors
def compare(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs to compare (default: every run that can be fitted).")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Run the others are judged "
                                                                    "against (default: the first).")] = None,
    margin: MarginOption = MARGIN,
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    method: MethodOption = "vp",
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    plot: PlotOption = None,
    loo_plot: Annotated[Path | None, typer.Option(
        "--loo-plot", help="Write the leave-one-out linearised plot (.png or .svg).")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Rank runs by ceiling A and give each a verdict against the baseline."""
    from scalectl import compare as cmp

    opts = FitOptions(axis, min_compute, method, "auto", bootstrap, 0.95, seed)
    with open_store(db) as store:
        if runs:
            infos = [store.get_run(r) for r in runs]
        else:
            infos = [r for r in store.list_runs() if r.get("n_points")]
            if not infos:
                raise UserError(f"no run with evaluation points in {store.path}")
        names = [r["name"] for r in infos]
        if len(set(names)) != len(names):
            raise UserError(f"a run is named twice: {names}")
        curves, left_out = {}, []
        for r in infos:
            try:
                curves[r["name"]] = fit_run(store, r, opts)[0]
            except UserError as exc:       # named runs must fit; of every run, those that can are compared
                if runs:
                    raise
                left_out.append(str(exc))
    for reason in left_out:
        err.print(f"left out: {reason}", markup=False)
    if len(curves) < 2 and left_out:
        raise UserError(f"fewer than two runs in {store.path} can be fitted; compare needs two")
    if baseline is not None and baseline not in curves:
        ids = {str(r["id"]): r["name"] for r in infos}
        if baseline not in ids:
            raise UserError(f"--baseline {baseline!r} is not one of the compared runs: "
                            f"{', '.join(curves)}")
        baseline = ids[baseline]
    try:
        result = cmp.compare(curves, baseline=baseline, margin=margin)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    written = []
    if plot is not None:
        from scalectl.plot import plot_curves

        written.append(str(_plot(plot_curves, curves, plot, baseline=result.baseline, margin=margin)))
    if loo_plot is not None:
        from scalectl.plot import plot_loo

        lines = cmp.loo_lines(curves)
        axis_name = next(iter(curves.values())).fit.axis
        written.append(str(_plot(plot_loo, lines, loo_plot, axis=axis_name)))
    if json_:
        data = result.to_dict()
        data["fits"] = {n: c.fit.to_dict() for n, c in curves.items()}
        data["plots"] = written
        print_json(data)
        return
    out.print(compare_table(result, curves, margin, out.width))
    for row in result.rows:
        if row.reason:
            out.print(f"{row.name}: {row.reason}", soft_wrap=True)
        _flag_lines(row.name, curves[row.name].fit)
    for f in result.flags:
        out.print(f"[red]{f.code}[/red]: {f.message}", soft_wrap=True)
    for path in written:
        err.print(f"wrote {path}")


def _plot(fn, data, path: Path, **kwargs) -> Path:
    try:
        return fn(data, path, **kwargs)
    except ValueError as exc:
        raise UserError(str(exc)) from None


# ----------------------------------------------------------------------------- extrapolate


@user_errors
def extrapolate(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    until: Annotated[float | None, typer.Option("--until", help="Fit up to this compute.")] = None,
    fraction: Annotated[float | None, typer.Option(
        "--fraction", help="Fit up to this fraction of the run's last compute (paper: 0.5).")] = None,
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    method: MethodOption = "vp",
    r0: R0Option = "auto",
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    drift_sd: Annotated[float, typer.Option(
        "--drift-sd", help="Sd of a run's drift from its curve past the fitted points, added to "
                           "the prediction band (default 0.01: half the paper's seed margin).")] = 0.01,
    plot: PlotOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Fit the start of a run, predict the rest, and report the error and window sensitivity."""
    from scalectl.curve import FitError
    from scalectl.extrapolate import extrapolate as extrap
    from scalectl.extrapolate import window_sensitivity

    if (until is None) == (fraction is None):
        raise UserError("give exactly one of --until C or --fraction F")
    if method not in ("vp", "grid"):
        raise UserError(f"--method {method!r} is not one of: vp, grid")
    with open_store(db) as store:
        info = store.get_run(run)
        ax = resolve_axis(info, FitOptions(axis=axis))
        x, y, trunc = load_points(store, info, ax)
        r0_se = r0_standard_error(store, info, ax)
    section = fit_section(info)
    min_compute = fit_window(section, ax, x, min_compute)
    if not drift_sd >= 0:
        raise UserError(f"--drift-sd must be >= 0 (given {drift_sd})")
    kw = dict(min_compute=min_compute, r0=parse_r0(r0), method=method, axis=ax, bootstrap=bootstrap,
              seed=seed, r0_se=r0_se)
    try:
        ex = extrap(x, y, until=until, fraction=fraction, truncation=trunc, drift_sd=drift_sd, **kw)
        kw.pop("min_compute")
        sens = window_sensitivity(x, y, min_compute=min_compute, **kw)
    except FitError as exc:
        raise UserError(f"run {info['name']!r}: {exc}: the part before the cut is too short to fit; "
                        "give a larger --fraction or --until, or extend the run") from None
    except ValueError as exc:
        raise UserError(f"run {info['name']!r}: {exc}") from None
    written = None
    if plot is not None:
        from scalectl.plot import plot_extrapolation

        keep = x <= ex.cut
        written = str(_plot(plot_extrapolation, ex, plot, name=info["name"],
                            fitted_compute=x[keep], fitted_pass_rate=y[keep]))
    if json_:
        data = ex.to_dict()
        data.update(run=info["name"], axis=ax, sensitivity=sens.to_dict(), plot=written)
        print_json(data)
        return
    for line in extrapolation_lines(info["name"], ax, ex):
        out.print(line, soft_wrap=True, markup=False)
    _flag_lines(info["name"], ex.fit)
    out.print(sensitivity_table(sens, out.width))
    if written:
        err.print(f"wrote {written}")


def register(app: typer.Typer) -> None:
    """Add ``fit``, ``compare`` and ``extrapolate`` to the app."""
    app.command()(fit)
    app.command()(compare)
    app.command()(extrapolate)
