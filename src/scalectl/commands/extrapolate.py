"""``scalectl extrapolate``: fit the start of a run, predict the rest, score the prediction."""

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
    open_store,
    out,
    print_flags,
    print_json,
    user_errors,
    write_figure,
)
from scalectl.defaults import TRUNCATION_THRESHOLD
from scalectl.errors import UserError
from scalectl.present.tables import extrapolation_lines, sensitivity_table
from scalectl.science.fits import (
    FitOptions,
    fit_r0,
    fit_section,
    fit_window,
    load_points,
    parse_r0,
    r0_standard_error,
    resolve_axis,
)


@user_errors
def extrapolate(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    until: Annotated[float | None, typer.Option(
        "--until", callback=number(0.0, lo_open=True), help="Fit up to this compute (> 0).")] = None,
    fraction: Annotated[float | None, typer.Option(
        "--fraction", callback=number(0.0, 1.0, lo_open=True),
        help="Fit up to this fraction of the run's last compute, in (0, 1] (paper: 0.5).")] = None,
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    method: MethodOption = "vp",
    r0: R0Option = None,
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    drift_sd: Annotated[float, typer.Option(
        "--drift-sd", callback=number(0.0, 1.0, note="a pass-rate sd"), help="Sd of a run's drift from its curve past the fitted points, added to "
                           "the prediction band (default 0.01: half the paper's seed margin).")] = 0.01,
    plot: PlotOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Fit the start of a run, predict the rest, and report the error and window sensitivity."""
    from scalectl.curve import FitError
    from scalectl.present.console import print_table
    from scalectl.science.extrapolate import extrapolate as extrap
    from scalectl.science.extrapolate import window_sensitivity

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
    # the truncation flag fires above the recipe's own threshold, as in `scalectl fit`
    threshold = float(section.get("truncation_threshold", TRUNCATION_THRESHOLD))
    kw = dict(min_compute=min_compute, r0=parse_r0(fit_r0(section, r0)), method=method, axis=ax,
              bootstrap=bootstrap, seed=seed, r0_se=r0_se, truncation_threshold=threshold)
    try:
        ex = extrap(x, y, until=until, fraction=fraction, truncation=trunc, drift_sd=drift_sd, **kw)
        kw.pop("min_compute")
        sens = window_sensitivity(x, y, min_compute=min_compute, **kw)
    except FitError as exc:
        raise UserError(f"run {info['name']!r}: {exc}: the part before the cut is too short to fit; "
                        + _shortest_cut(x, y, kw, trunc, drift_sd)) from None
    except ValueError as exc:
        raise UserError(f"run {info['name']!r}: {exc}") from None
    written = None
    if plot is not None:
        from scalectl.present.plot import plot_extrapolation

        keep = x <= ex.cut
        written = str(write_figure(plot_extrapolation, ex, plot, name=info["name"],
                            fitted_compute=x[keep], fitted_pass_rate=y[keep]))
    if json_:
        data = ex.to_dict()
        data.update(run=info["name"], axis=ax, sensitivity=sens.to_dict(), plot=written)
        print_json(data)
        return
    for line in extrapolation_lines(info["name"], ax, ex):
        out.print(line, soft_wrap=True, markup=False)
    print_flags(info["name"], ex.fit)
    print_table(sensitivity_table(sens))
    if written:
        err.print(f"wrote {written}")


def _shortest_cut(x, y, kw: dict, trunc, drift_sd: float) -> str:
    """What a run too short for the cut can do: the smallest --fraction (at one of its points)
    whose prefix can be fitted with a point left to predict, or that it must be extended."""
    from scalectl.curve import FitError
    from scalectl.science.extrapolate import extrapolate as extrap

    quick = dict(kw, bootstrap=0)
    for cut in sorted(set(float(c) for c in x if c > 0))[:-1]:        # the last point must stay held out
        fraction = cut / float(max(x))
        try:
            extrap(x, y, until=cut, truncation=trunc, drift_sd=drift_sd, **quick)
        except (FitError, ValueError):
            continue
        return (f"this run ({len(x)} points) can be fitted from --fraction {math.ceil(fraction * 100) / 100:g} "
                f"(--until {cut:g}: {int((x <= cut).sum())} points fitted, {int((x > cut).sum())} held out); "
                "or extend the run")
    return f"no cut of this run ({len(x)} points) leaves enough points to fit and one to predict: extend the run"


def register(app: typer.Typer) -> None:
    """Add ``extrapolate`` to the app."""
    app.command()(extrapolate)
