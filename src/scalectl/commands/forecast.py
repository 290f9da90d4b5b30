"""``scalectl forecast``: where a run will be at compute it has not spent, the compute a target
pass rate needs, and where one run's curve crosses another's."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from scalectl.commands.bounds import number
from scalectl.commands.common import (
    AxisOption,
    BootstrapOption,
    DbOption,
    JsonOption,
    MethodOption,
    MinComputeOption,
    PlotOption,
    R0Option,
    SeedOption,
    err,
    note,
    open_store,
    out,
    print_json,
    user_errors,
    write_figure,
)
from scalectl.errors import UserError
from scalectl.science.fits import FitOptions, check_options, fit_with_draws

#: Where a run is forecast when no --at is given: these multiples of its last point's compute.
DEFAULT_MULTIPLES = ("2x", "4x", "10x")
#: How far crossings are searched and curves drawn when no --horizon is given.
DEFAULT_HORIZON = "10x"


@user_errors
def forecast(
    runs: Annotated[list[str], typer.Argument(help="Run names or ids (with --pool: seeds of one recipe).")],
    at: Annotated[list[str] | None, typer.Option(
        "--at", help="Compute to forecast the pass rate at, beyond the last point: a value on the axis (3.5e13) "
                     "or a multiple of the run's last point (4x); repeatable (default: 2x, 4x, 10x).")] = None,
    target: Annotated[list[float] | None, typer.Option(
        "--target", help="A pass rate in (0, 1): the compute that reaches it, with its interval; repeatable.")] = None,
    horizon: Annotated[str | None, typer.Option(
        "--horizon", help="How far crossings are searched and curves drawn: a value on the axis or a multiple "
                          "of the last point of all the runs (default 10x).")] = None,
    pool: Annotated[bool, typer.Option(
        "--pool", help="Fit the runs' points together as one curve (seeds of one recipe).")] = False,
    allow_unidentified: Annotated[bool, typer.Option(
        "--allow-unidentified", help="Forecast from a fit whose ceiling is not identified (each number then "
                                     "carries the fit's flags).")] = False,
    drift_sd: Annotated[float, typer.Option(
        "--drift-sd", callback=number(0.0, 1.0, note="a pass-rate sd"),
        help="Sd of a run's drift from its curve past the fitted points, added to the band (default 0.01: "
             "half the paper's seed margin).")] = 0.01,
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    method: MethodOption = "vp",
    r0: R0Option = None,
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    plot: PlotOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Forecast from the fitted curve: the pass rate (with its 95 % band) at compute not yet spent,
    the compute to reach a target pass rate, and, for two or more runs, where their curves cross.

    Refuses a fit whose ceiling A is not identified unless --allow-unidentified.  Bands come from
    the fit's bootstrap draws; nothing is stored."""
    from scalectl.science import forecast as fc

    opts = FitOptions(axis, min_compute, method, r0, bootstrap, 0.95, seed)
    check_options(opts)
    targets = list(target or [])
    for t in targets:
        if not (math.isfinite(t) and 0.0 < t < 1.0):
            raise UserError(f"--target {t:g} is not a pass rate strictly between 0 and 1")
    with open_store(db) as store:
        infos = [store.get_run(r) for r in runs]
        names = [r["name"] for r in infos]
        if len(set(names)) != len(names):
            raise UserError(f"a run is named twice: {names}")
        if pool:
            if len(infos) < 2:
                raise UserError("--pool needs two or more runs (seeds of one recipe)")
            curve, ax = fit_with_draws(store, infos, opts, log=note)
            curves = {" + ".join(names): curve}
        else:
            curves = {}
            for r in infos:
                curves[r["name"]], ax = fit_with_draws(store, [r], opts, log=note)
    axes = {c.fit.axis for c in curves.values()}
    if len(axes) > 1:
        raise UserError(f"the runs are fitted on different axes ({', '.join(sorted(axes))}): "
                        "choose one with --axis")
    for name, c in curves.items():
        reasons = fc.unidentified_reasons(c.fit)
        if reasons and not allow_unidentified:
            raise UserError(f"{name}: no forecast from a fit whose ceiling is not identified ("
                            + "; ".join(reasons) + "): extend the run, or pass --allow-unidentified to "
                            "forecast anyway (every number then carries the flag)")
    last_all = max(float(c.compute.max()) for c in curves.values())
    try:
        hz_text = horizon or DEFAULT_HORIZON
        hz = fc.parse_compute(hz_text, last_all, "--horizon")
        fc.check_compute([hz], after=last_all, what=f"--horizon {hz_text}")
        results = {}
        for name, c in curves.items():
            last = float(c.compute.max())
            at_values = set()
            for text in at or DEFAULT_MULTIPLES:        # each checked as the user wrote it
                value = fc.parse_compute(text, last, "--at")
                fc.check_compute([value], after=last, what=f"--at {text}" + ("" if pool or len(curves) < 2
                                                                              else f" (run {name})"))
                at_values.add(value)
            results[name] = dict(
                last=last,
                at=fc.pass_rate_at(c.fit, sorted(at_values), last=last,
                                   drift_sd=drift_sd, seed=seed),
                reach=[fc.reach(c.fit, t, last=last, best_measured=float(c.pass_rate.max())) for t in targets])
        # crossings ahead: from the compute every run reached (where the points show who leads)
        start = min(float(c.compute.max()) for c in curves.values())
        crossings = fc.crossings({n: c.fit for n, c in curves.items()}, start=start, horizon=hz) \
            if len(curves) > 1 else []
    except fc.ForecastError as exc:
        raise UserError(str(exc)) from None
    written = None
    if plot is not None:
        from scalectl.present.plot import plot_forecast

        written = str(write_figure(plot_forecast, curves, plot, horizon=hz, targets=targets, drift_sd=drift_sd,
                                   reaches={n: r["reach"] for n, r in results.items()}, crossings=crossings))
    if json_:
        print_json({
            "axis": ax, "drift_sd": drift_sd, "horizon": hz, "pooled": pool,
            "runs": {n: {"fit": curves[n].fit.to_dict(), "last": r["last"], "at": [f.to_dict() for f in r["at"]],
                         "targets": [x.to_dict() for x in r["reach"]]} for n, r in results.items()},
            "crossings": [x.to_dict() for x in crossings], "plot": written})
        return
    from scalectl.present.tables import forecast_lines

    for line in forecast_lines(curves, results, crossings, ax, hz):
        out.print(line, soft_wrap=True, markup=False, highlight=False)
    if written:
        err.print(f"wrote {written}")


def register(app: typer.Typer) -> None:
    """Add ``forecast`` to the app."""
    app.command()(forecast)
