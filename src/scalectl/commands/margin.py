"""``scalectl margin``: your own noise margin on A, measured from repeated runs of one recipe."""

from __future__ import annotations

from typing import Annotated

import typer

from scalectl.commands.common import (
    AxisOption,
    BootstrapOption,
    DbOption,
    JsonOption,
    LevelOption,
    MethodOption,
    MinComputeOption,
    R0Option,
    SeedOption,
    open_store,
    out,
    print_json,
    user_errors,
)
from scalectl.errors import UserError


@user_errors
def margin(
    runs: Annotated[list[str] | None, typer.Argument(
        help="Runs (names or ids) that are seeds of one recipe; default: every recipe hash in the store "
             "with at least 3 completed runs.")] = None,
    level: LevelOption = 0.95,
    axis: AxisOption = None,
    min_compute: MinComputeOption = None,
    r0: R0Option = None,
    method: MethodOption = "vp",
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    until_step: Annotated[int | None, typer.Option(
        "--until-step", help="Fit each named run on its points up to this step: runs trained further read as "
                             "runs of that budget (seeds of one recipe, budgets aside; each must have reached it).")
    ] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Measure the noise margin on A from the seed-to-seed spread of ceilings in the store.

    The rule (docs/fitting.md, "Your own margin"): 2 x the sd of the fitted ceilings A of
    at least 3 completed runs of one recipe hash (one setup), with the chi-square interval
    of that sd at --level; the paper's rule on the same runs (their largest deviation
    from the mean, rounded up to 0.01) is printed beside it.  Use the value with
    `compare --margin`, `ablate --margin`, or `--margin auto` to measure it there.
    """
    from scalectl.science.fits import FitOptions
    from scalectl.science.margin import MIN_RUNS, measure, measure_until, seed_groups

    opts = FitOptions(axis, min_compute, method, r0, bootstrap, 0.95, seed)
    measured, short, failed = [], [], []
    with open_store(db) as store:
        if until_step is not None and not runs:
            raise UserError("--until-step needs the runs named (scalectl margin RUN RUN RUN --until-step N)")
        if runs and until_step is not None:
            measured.append(measure_until(store, [store.get_run(r) for r in runs], opts, until_step, level=level))
        elif runs:
            measured.append(measure(store, [store.get_run(r) for r in runs], opts, level=level))
        else:
            for digest, group in seed_groups(store).items():
                names = [r["name"] for r in group]
                if len(group) < MIN_RUNS:
                    short.append({"recipe_hash": digest, "runs": names, "more": MIN_RUNS - len(group)})
                    continue
                try:
                    measured.append(measure(store, group, opts, level=level, recipe_hash=digest))
                except UserError as exc:
                    failed.append({"recipe_hash": digest, "runs": names, "error": str(exc)})
    if json_:
        print_json({"margins": [m.to_dict() for m in measured], "too_few_runs": short, "not_measured": failed})
        return
    for m in measured:
        _print_margin(m)
    for s in failed:
        out.print(f"recipe {s['recipe_hash']}: {s['error']}", soft_wrap=True, markup=False)
    for s in short:
        out.print(f"recipe {s['recipe_hash']}: {len(s['runs'])} completed run(s) ({', '.join(s['runs'])}); "
                  f"{s['more']} more seed(s) measure a margin", soft_wrap=True, markup=False)
    if not measured:
        raise UserError("no margin measured: " + (
            "no recipe with enough completed runs has fits that identify the ceiling (above)" if failed else
            f"a margin needs at least {MIN_RUNS} completed runs of one recipe hash (`scalectl run RECIPE "
            "--seed N`, `scalectl ablate ... --repeats 3`)"))


def _print_margin(m) -> None:
    """A measured margin in three lines: its runs and their ceilings, the margin with its
    interval and the paper's rule on the same runs, and how to use it."""
    what = f"recipe {m.recipe_hash}" if m.recipe_hash else "runs"
    out.print(f"{what}: {len(m.runs)} runs ({', '.join(m.runs)}): A {m.mean:.4f} mean, sd {m.sd:.4f}"
              + (f"; left out, ceiling not identified: {', '.join(m.left_out)}" if m.left_out else ""),
              soft_wrap=True, markup=False, highlight=False)
    lo, hi = m.interval
    out.print(f"  margin {m.value:.3g} [{lo:.3g}, {hi:.3g}] ({m.level:.0%} chi-square interval of 2 x sd); "
              f"the paper's rule on these runs (largest deviation from the mean, rounded up to 0.01): "
              f"{m.paper_rule:.2g}", soft_wrap=True, markup=False, highlight=False)
    if m.fit_sd is not None:
        share = min(m.fit_sd ** 2 / m.sd ** 2, 1.0)
        out.print(f"  of the ceilings' variance, {share:.0%} is the fits' own uncertainty on A (sd {m.fit_sd:.4f}) and "
                  f"{1 - share:.0%} the runs' (sd {m.run_sd:.4f}): fits without error would give a margin of "
                  f"{2 * m.run_sd:.3g}; longer runs or a larger evaluation narrow it that far, no further",
                  soft_wrap=True, markup=False, highlight=False)
    out.print(f"  use it: --margin {m.value:.3g} (compare, ablate, report), or --margin auto", soft_wrap=True,
              markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``margin`` to the app."""
    app.command()(margin)
