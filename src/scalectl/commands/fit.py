"""``scalectl fit``: fit the sigmoid to runs and store the fits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.common import (
    AxisOption,
    BootstrapOption,
    DbOption,
    FormatOption,
    JsonOption,
    LevelOption,
    MarginOption,
    MethodOption,
    MinComputeOption,
    R0Option,
    SeedOption,
    SeriesOption,
    err,
    note,
    open_store,
    out,
    print_flags,
    print_json,
    user_errors,
    write_figure,
)
from scalectl.defaults import MARGIN
from scalectl.present.tables import fit_table
from scalectl.science.fits import FitOptions, fit_run


@user_errors
def fit(
    runs: Annotated[list[str], typer.Argument(help="Run names or ids.")],
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    method: MethodOption = "vp",
    r0: R0Option = None,
    bootstrap: BootstrapOption = 1000,
    level: LevelOption = 0.95,
    seed: SeedOption = 0,
    margin: MarginOption = MARGIN,
    refit: Annotated[bool, typer.Option("--refit", help="Recompute even if stored.")] = False,
    series: SeriesOption = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Draw the points, fitted curves, ceilings with their intervals and the "
                       "margin band around the first run's ceiling (.png or .svg).")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
    fmt: FormatOption = "table",
) -> None:
    """Fit R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to each run and store the fits.

    A run without values on the axis (--axis, else its recipe's) is fitted on the axis it has,
    with a note.  In a pipe or a file the table has every column whole (--format csv: its cells
    as CSV).
    """
    from scalectl.present.console import print_table

    from scalectl.curve import advise, seed_spread, step_rate

    opts = FitOptions(axis, min_compute, method, r0, bootstrap, level, seed, series)
    results, curves = [], {}
    with open_store(db) as store:
        for ref in runs:
            run = store.get_run(ref)
            curve, cached, key = fit_run(store, run, opts, refit=refit, log=note)
            rate = step_rate(store.points(run["id"]), curve.fit.axis, source=run["name"])
            advice = advise(curve.fit, margin, rate=rate) if curve.fit.interval("A") else None
            results.append((run, curve.fit, cached, key, advice))
            curves[run["name"]] = curve
    written = None
    if plot is not None:
        from scalectl.present.plot import plot_curves

        written = str(write_figure(plot_curves, curves, plot, baseline=next(iter(curves)), margin=margin))
    by_hash: dict[str, list] = {}
    for run, f, *_ in results:
        if run.get("recipe_hash"):
            by_hash.setdefault(run["recipe_hash"], []).append(f)
    spreads = {h: seed_spread(fs) for h, fs in by_hash.items() if len(fs) > 1}
    if json_ or fmt == "json":
        print_json({
            "fits": [{"run": r["name"], "run_id": r["id"], "key": k, "cached": c, "fit": f.to_dict(),
                      "advice": None if a is None else {"action": a.action, "message": a.message,
                                                        "seeds_needed": a.seeds_needed, "steps": a.steps,
                                                        "device_hours": a.device_hours, "seconds": a.seconds}}
                     for r, f, c, k, a in results],
            "seed_spread": {h: {n: vars(s) for n, s in sp.items()} for h, sp in spreads.items()},
            "plot": written,
        })
        return
    axes = sorted({f.axis for _, f, *_ in results})
    print_table(fit_table([(run["name"] + (" (stored)" if cached else ""), f)
                           for run, f, cached, _, _ in results], axes), fmt)
    say = out if fmt == "table" else err        # under a CSV table, on stderr: stdout holds the CSV
    for run, f, _, _, advice in results:
        print_flags(run["name"], f, console=say)
        if advice is not None and advice.action != "none":
            say.print(f"[cyan]{run['name']}[/cyan] {advice.message}", soft_wrap=True)
    for h, sp in spreads.items():
        a, b = sp["A"], sp["B"]
        say.print(f"recipe {h}: {a.n} runs, A {a.mean:.3f} +- {a.sd:.3f} (range {a.min:.3f}-"
                  f"{a.max:.3f}), B {b.mean:.2f} +- {b.sd:.2f}")
    if written:
        err.print(f"wrote {written}")


def register(app: typer.Typer) -> None:
    """Add ``fit`` to the app."""
    app.command()(fit)
