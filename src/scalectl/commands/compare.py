"""``scalectl compare``: rank runs by ceiling A, each judged against a baseline with the margin."""

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
    MarginChoiceOption,
    MethodOption,
    MinComputeOption,
    R0Option,
    PlotOption,
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
from scalectl.display import format_compute
from scalectl.errors import UserError
from scalectl.present.tables import compare_table
from scalectl.science.fits import FitOptions, check_options, fit_run
from scalectl.science.margin import resolve as resolve_margin


@user_errors
def compare(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs to compare (default: every run that can be fitted).")] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Run the others are judged "
                                                                    "against (default: the first).")] = None,
    margin: MarginChoiceOption = None,
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    r0: R0Option = None,
    method: MethodOption = "vp",
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    plot: PlotOption = None,
    series: SeriesOption = None,
    loo_plot: Annotated[Path | None, typer.Option(
        "--loo-plot", help="Write the leave-one-out linearised plot (.png or .svg).")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
    fmt: FormatOption = "table",
) -> None:
    """Rank runs by ceiling A and give each a verdict against the baseline.

    The margin (ceilings closer than it tie) is the paper's 0.02 unless --margin gives one;
    --margin auto measures it from the completed runs of the baseline's recipe hash (at
    least 3 seeds: `scalectl margin`).  The line under the table names the margin used.  A run
    without values on the axis is fitted on the axis it has, with a note; mixed axes are flagged.
    A run that cannot be fitted (too few points in its window, a failed fit) is left out of the
    ranking and listed under the table with the reason; the others are compared.  Fewer than two
    runs that can be fitted (of two or more) is an error (exit 2), and so is a --baseline that
    cannot be fitted.  The table keeps run, A, dA and the verdict at any terminal width; in a pipe
    or a file it has every column whole (--format csv: its cells as CSV)."""
    from scalectl.present.console import print_table
    from scalectl.science import compare as cmp

    opts = FitOptions(axis, min_compute, method, r0, bootstrap, 0.95, seed, series)
    check_options(opts)          # a bad option is no run's fault: refused before any run is left out
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
        curves, left_out = {}, {}
        for r in infos:
            try:
                curves[r["name"]] = fit_run(store, r, opts, log=note)[0]
            except UserError as exc:       # left out of the ranking, named under it with the reason
                left_out[r["name"]] = str(exc)
        baseline = _baseline(baseline, curves, infos, left_out, store.path)
        hashes = {r["name"]: r.get("recipe_hash") for r in infos}
        used = resolve_margin(store, margin, hashes.get(baseline or next(iter(curves))), opts)
    try:
        result = cmp.compare(curves, baseline=baseline, margin=used.value)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    margin = used.value
    written = []
    if plot is not None:
        from scalectl.present.plot import plot_curves

        written.append(str(write_figure(plot_curves, curves, plot, baseline=result.baseline, margin=margin)))
    if loo_plot is not None:
        from scalectl.present.plot import plot_loo

        lines = cmp.loo_lines(curves, margin=margin)     # ceilings apart beyond it: each its own A
        axis_name = next(iter(curves.values())).fit.axis
        written.append(str(write_figure(plot_loo, lines, loo_plot, axis=axis_name,
                                        fits={n: c.fit for n, c in curves.items()}, margin=margin)))
    if json_ or fmt == "json":
        data = result.to_dict()
        data["margin_source"] = used.to_dict()
        data["fits"] = {n: c.fit.to_dict() for n, c in curves.items()}
        data["plots"] = written
        data["left_out"] = [{"run": name, "reason": reason} for name, reason in left_out.items()]
        print_json(data)
        return
    print_table(compare_table(result, curves, margin), fmt)
    say = out if fmt == "table" else err        # under a CSV table, on stderr: stdout holds the CSV
    say.print(used.line(), soft_wrap=True, markup=False, highlight=False)
    reasons = [row.reason for row in result.rows if row.reason]
    for row in result.rows:
        if row.reason:
            say.print(f"{row.name}: {row.reason}", soft_wrap=True)
        # a flag a verdict gave as its reason: once
        print_flags(row.name, curves[row.name].fit, said=reasons, console=say)
    for c in result.crossings:
        iv = "" if c.lo is None else f" [{format_compute(c.lo)}, {format_compute(c.hi)}]"
        say.print(f"crossing: {c.first} (lower ceiling) leads at {format_compute(c.start)}, the compute both "
                  f"reached; {c.second} overtakes it at {format_compute(c.compute)}{iv} "
                  f"(scalectl forecast {c.first} {c.second} draws it)", soft_wrap=True, markup=False,
                  highlight=False)
    for f in result.flags:
        say.print(f"[red]{f.code}[/red]: {f.message}", soft_wrap=True)
    for reason in left_out.values():      # not ranked: each with why it cannot be fitted
        say.print(f"left out: {reason}", soft_wrap=True, markup=False, highlight=False)
    for path in written:
        err.print(f"wrote {path}")


def _baseline(baseline: str | None, curves: dict, infos: list[dict], left_out: dict[str, str], path
              ) -> str | None:
    """The baseline's name: ``--baseline`` as a name or id of a compared run (None: the first).

    Args:
        curves: run name -> its fitted curve, for the runs that could be fitted.
        infos: the stored runs asked for (dicts with ``id`` and ``name``).
        left_out: run name -> why it cannot be fitted.

    Raises:
        UserError: fewer than two runs fitted of several (each left-out run with its reason),
            a baseline that cannot be fitted, or one not among the runs.
    """
    if len(curves) < 2 and left_out:
        reasons = "".join(f"\n  left out: {reason}" for reason in left_out.values())
        can = ", ".join(curves) or "none"
        raise UserError(f"compare needs two runs that can be fitted; of {len(infos)} run(s) in {path}, "
                        f"{len(curves)} can ({can}):{reasons}")
    if baseline is None or baseline in curves:
        return baseline
    ids = {str(r["id"]): r["name"] for r in infos}
    name = ids.get(baseline, baseline)
    if name in left_out:
        raise UserError(f"--baseline {baseline!r} cannot be fitted, so nothing can be judged against it: "
                        f"{left_out[name]}")
    if baseline not in ids:
        raise UserError(f"--baseline {baseline!r} is not one of the compared runs: {', '.join(curves)}")
    return ids[baseline]


def register(app: typer.Typer) -> None:
    """Add ``compare`` to the app."""
    app.command()(compare)
