"""``scalectl run``: validate a recipe, create the run, train it (or resume it).

Arguments and rendering; the run is :func:`scalectl.launch.runs.start`'s,
:func:`~scalectl.launch.runs.resume`'s or :func:`~scalectl.launch.runs.dry_run`'s."""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from scalectl.commands.bounds import MAX_SEED, number
from scalectl.commands.common import (
    DbOption,
    JsonOption,
    err,
    open_store,
    out,
    print_json,
    user_errors,
)
from scalectl.display import format_number
from scalectl.errors import UserError
from scalectl.present.progress import RichReporter


def _log(message: str) -> None:
    err.print(message, highlight=False)


@user_errors
def run(
    recipe_file: Annotated[Path | None, typer.Argument(
        metavar="RECIPE", help="Recipe TOML (how to train), or a preset name: scalerl, grpo, ... (scalectl recipes).")] = None,
    setup: Annotated[Path | None, typer.Option(
        help="Setup TOML (where and how big) or preset name; default tiny-cpu.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override KEY=VALUE (repeatable).")] = [],
    name: Annotated[str | None, typer.Option(help="Run name (default: recipe name and seed).")] = None,
    seed: Annotated[int | None, typer.Option(callback=number(0, MAX_SEED),
                                             help="Seed (overrides the recipe's).")] = None,
    resume: Annotated[str | None, typer.Option(help=
        "Continue run RUN from its last checkpoint; a completed run only with a raised budget "
        "(--set budget.steps=N).")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("runs"),
    launcher: Annotated[str | None, typer.Option(
        help="Where the run executes: local or slurm (default: the setup's launcher.type).")] = None,
    detach: Annotated[bool, typer.Option(
        "--detach", help="Local launcher: train in a background process and return at once.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the plan (and for Slurm the sbatch parameters and script), submit nothing.")] = False,
    new_run: Annotated[bool, typer.Option(
        "--new-run", help="Train a new run even when the store holds one of the same recipe content and seed "
                          "(by default it is reused, resumed or extended).")] = False,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Train a recipe: warm start if needed, then RL, storing every evaluation point.

    Local runs train in the foreground with live progress (Ctrl-C checkpoints
    and stops) unless --detach; Slurm runs are submitted and the command
    returns (follow with `scalectl logs RUN --follow`, `scalectl status`).

    A run of the same recipe content and seed already in the store, whatever its
    name, is not trained again: a completed one is reused, a stopped one resumed,
    one trained to a smaller budget extended, one still training left to its job
    (a `note:` line says which); --new-run trains a new run regardless.
    """
    from scalectl.launch import runs

    runs.check_launcher(launcher)
    stores = functools.partial(open_store, db)
    given = {"launcher": launcher, "detach": detach, "log": _log}
    with contextlib.ExitStack() as held:      # a resumed run's folder lock, until the command ends
        if resume is not None:
            started = runs.resume(stores, resume, overrides=set_, reporter=RichReporter(), hold=held, **given)
        elif recipe_file is None:
            raise UserError("give a RECIPE file or preset name (e.g. scalerl; see `scalectl recipes`) or --resume RUN")
        else:
            loaded = {"setup": setup, "overrides": list(set_) + ([f"seed={seed}"] if seed is not None else []),
                      "name": name, "runs_dir": runs_dir}
            if dry_run:
                _print_dry_run(runs.dry_run(recipe_file, **loaded, **given, stores=stores), json_, stores)
                return
            started = runs.start(stores, recipe_file, **loaded, reporter=RichReporter(), new_run=new_run,
                                 hold=held, **given)
        _print_started(started, stores, json_)


def _print_dry_run(planned, json_: bool, stores) -> None:
    """What would be launched (:class:`scalectl.launch.runs.Planned`): JSON, or the launcher's
    summary and its script verbatim; before them, the pass rate the booking is forecast to buy
    when the store holds runs of the recipe (:mod:`scalectl.science.booked`)."""
    from scalectl.science.booked import forecast_lines

    forecast = forecast_lines(planned.recipe, planned.booking, stores) if planned.booking is not None else []
    if json_:
        print_json(planned.to_dict() | {"forecast": forecast})
        return
    for line in forecast:
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    err.print(planned.described.summary, highlight=False)
    if planned.described.script is not None:
        sys.stdout.write(planned.described.script)   # verbatim: no wrapping


def _print_started(started, stores, json_: bool) -> None:
    """Where the run went, or how its training here ended (with its fitted curve)."""
    from scalectl.launch.runs import ATTACHED, FAILED, REUSED, STOPPED, SUBMITTED

    if started.outcome in (REUSED, ATTACHED):
        _print_stored(started, stores, json_)
    elif started.outcome == SUBMITTED:
        _print_submitted(started, json_)
    elif started.outcome == STOPPED:
        err.print(f"stopped; continue with: scalectl run --resume {started.run_dir.name}")
        raise typer.Exit(130)
    elif started.outcome == FAILED:
        err.print(f"[red]run failed:[/red] {escape(started.error)}\n(traceback in {started.error_log})", markup=True)
        raise typer.Exit(1)
    else:
        _print_done(started, stores, json_)


def _print_done(started, stores, json_: bool) -> None:
    from scalectl.present.summary import summarize_run

    summary = started.summary
    with stores() as store:
        lines, summary["fit"] = summarize_run(store, started.run_id, started.run_dir / "curve.png")
    if json_:
        print_json({"run": started.name, "run_id": started.run_id, "outcome": started.outcome, **summary})
        return
    first, last, flops = (format_number(summary[k], decimals=True)
                          for k in ("first_pass_rate", "last_pass_rate", "flops"))
    out.print(f"done: {summary['steps']} steps, pass rate {first} -> {last}, {flops} FLOPs, "
              f"{format_number(summary['gpu_hours'], 4, decimals=True)} device-hours, "
              f"{summary['retired_prompts']} prompts retired")
    for line in lines:
        out.print(line, soft_wrap=True, markup=False)


def _print_stored(started, stores, json_: bool) -> None:
    """A stored run of the same recipe and seed that stands for the one asked for: reused (its
    points and fitted curve, as at the end of a run) or still being trained by its job."""
    from scalectl.launch.runs import REUSED
    from scalectl.present.summary import summarize_run

    with stores() as store:
        row = store.get_run(started.run_id)
        pts = store.points(started.run_id)
        lines, fit = (summarize_run(store, started.run_id, started.run_dir / "curve.png")
                      if started.outcome == REUSED and pts and row.get("run_dir") else ([], None))
    last = pts[-1] if pts else {}
    if json_:
        print_json({"run": started.name, "run_id": started.run_id, "outcome": started.outcome,
                    "status": row["status"], "steps": last.get("step"), "points": len(pts),
                    "last_pass_rate": last.get("pass_rate"), "fit": fit})
        return
    if started.outcome != REUSED:
        out.print(f"run {started.name} is {row['status']}; nothing started")
        return
    rate = format_number(last.get("pass_rate"), decimals=True) if last else "-"
    out.print(f"reused run {started.name}: {last.get('step', 0)} steps, {len(pts)} points, last pass rate {rate}")
    for line in lines:
        out.print(line, soft_wrap=True, markup=False)


def _print_submitted(started, json_: bool) -> None:
    job, name = started.job, started.name
    if json_:
        print_json({"run": name, "run_id": started.run_id, "launcher": started.launcher, "job_id": job.job_id,
                    "run_dir": str(started.run_dir), "log": job.log})
        return
    out.print(f"submitted run {name} to {started.launcher} as job {job.job_id}; log {job.log}")
    err.print(f"follow it with `scalectl logs {name} --follow`; `scalectl status` lists every run; "
              f"`scalectl cancel {name}` stops it")


def register(app: typer.Typer) -> None:
    """Add ``run`` to the app."""
    app.command()(run)
