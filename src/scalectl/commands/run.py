"""``scalectl run``: validate a recipe, create the run, train it (or resume it)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from scalectl.commands.common import (
    DbOption,
    JsonOption,
    err,
    fmt,
    open_store,
    out,
    print_json,
    user_errors,
)
from scalectl.errors import UserError
from scalectl.present.progress import RichReporter


def budget_text(budget) -> str:
    """``steps=400``, ``gpu_hours=16000`` or both: the limits a run's budget sets."""
    parts = [f"{key}={value:g}" for key, value in (("steps", budget.steps), ("gpu_hours", budget.gpu_hours))
             if value is not None]
    return " ".join(parts) or "none"


def plan_lines(recipe, setup_path, launcher: str | None = None) -> list[str]:
    """A short human summary of what a run will do (``launcher``: the one it is sent to, when
    ``--launcher`` overrides the recipe's)."""
    r = recipe
    return [
        f"recipe {r.name} (hash {r.content_hash}, seed {r.seed}) on setup {setup_path}",
        f"  loss {r.loss.type} (clip_low {r.loss.clip_low}, clip_high {r.loss.clip_high}, "
        f"{r.loss.aggregation} aggregation), advantage normalization {r.advantage.normalization}, "
        f"LM head {r.precision.lm_head}",
        f"  async {r.async_.mode} k={r.async_.k}; filters: zero_variance={r.filter.zero_variance} "
        f"dynamic_sampling={r.filter.dynamic_sampling} retire_solved={r.filter.retire_solved}"
        f"@{r.filter.retire_threshold}; length control {r.length.control}",
        f"  batch {r.batch.prompts_per_step} prompts x {r.batch.generations_per_prompt} generations, "
        f"max_new_tokens {r.length.max_new_tokens}, lr {r.optim.lr} (warm-up {r.optim.warmup_steps})",
        f"  model {r.model.path} ({r.model.dtype}), data {r.data.source}, eval every {r.eval.every_steps} "
        f"steps on {r.eval.prompts} prompts x {r.eval.samples_per_prompt}",
        f"  hardware {r.hardware.name}: {r.hardware.generators} generator(s) + {r.hardware.trainers} "
        f"trainer(s), launcher {launcher or r.launcher.type}, budget {budget_text(r.budget)}",
    ]


@user_errors
def run(
    recipe_file: Annotated[Path | None, typer.Argument(
        metavar="RECIPE", help="Recipe TOML (how to train), or a preset name: scalerl, grpo, ... (scalectl recipes).")] = None,
    setup: Annotated[Path | None, typer.Option(
        help="Setup TOML (where and how big) or preset name; default tiny-cpu.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override KEY=VALUE (repeatable).")] = [],
    name: Annotated[str | None, typer.Option(help="Run name (default: recipe name and seed).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (overrides the recipe's).")] = None,
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
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Train a recipe: warm start if needed, then RL, storing every evaluation point.

    Local runs train in the foreground with live progress (Ctrl-C checkpoints
    and stops) unless --detach; Slurm runs are submitted and the command
    returns (follow with `scalectl logs RUN --follow`, `scalectl status`).
    """
    from scalectl.launch.registry import LAUNCHER_TYPES

    if launcher is not None and launcher not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {launcher!r} is not one of: {', '.join(LAUNCHER_TYPES)}")
    with contextlib.ExitStack() as held:      # a resumed run's folder lock, until the command ends
        _run(recipe_file, setup, set_, name, seed, resume, runs_dir, launcher, detach, dry_run, db, json_, held)


def _run(recipe_file, setup, set_, name, seed, resume, runs_dir, launcher, detach, dry_run, db, json_,
         held: contextlib.ExitStack) -> None:
    from scalectl.job.body import run_job
    from scalectl.job.trackers import check_installed
    from scalectl.launch.registry import get_launcher
    from scalectl.launch.runs import create_run, start_here, unique_name
    from scalectl.names import check_name
    from scalectl.recipe.load import find_default_setup, load

    if resume is not None:
        info, recipe = _prepare_resume(resume, list(set_), db, held)
        run_dir = Path(info["run_dir"])
        run_id, run_name = info["id"], info["name"]
        kind = launcher or info.get("launcher") or recipe.launcher.type
        err.print(f"resuming run {run_name} from {run_dir}")
    else:
        if recipe_file is None:
            raise UserError("give a RECIPE file or preset name (e.g. scalerl; see `scalectl recipes`) or --resume RUN")
        setup_path = setup or find_default_setup(recipe_file)
        overrides = list(set_) + ([f"seed={seed}"] if seed is not None else [])
        recipe = load(recipe_file, setup_path, overrides)
        check_installed(recipe.logging)
        kind = launcher or recipe.launcher.type
        for line in plan_lines(recipe, setup_path, kind):
            err.print(line, highlight=False)
        layout = _check_layout(recipe, kind, dry_run)
        if dry_run:
            run_name = check_name(name or f"{recipe.name}-s{recipe.seed}")
            _print_dry_run(recipe, kind, detach, run_name, (runs_dir / run_name).resolve(), json_, layout)
            return
        with open_store(db, create=True) as store:
            _note_same_run(store, recipe)
            run_name = check_name(name) if name else check_name(
                unique_name(store, f"{recipe.name}-s{recipe.seed}", runs_dir),
                "run name (from the recipe's name)")
            run_id, run_dir = create_run(store, recipe, run_name, runs_dir, launcher=kind)
        err.print(f"run {run_name} (id {run_id}), folder {run_dir}")
    if detach or not get_launcher(kind).runs_here:
        _submit(kind, run_id, run_name, run_dir, recipe, db, json_)
        return
    with open_store(db) as store:
        start_here(store, run_id, run_dir, kind)
    try:
        summary = run_job(run_dir, reporter=RichReporter())
    except KeyboardInterrupt:
        err.print(f"stopped; continue with: scalectl run --resume {run_dir.name}")
        raise typer.Exit(130) from None
    except UserError:
        raise
    except Exception as exc:  # the run is marked failed in the store; the traceback goes to its folder
        import traceback

        (run_dir / "error.log").write_text(traceback.format_exc())
        err.print(f"[red]run failed:[/red] {escape(str(exc) or type(exc).__name__)}\n(traceback in {run_dir / 'error.log'})", markup=True)
        raise typer.Exit(1) from None
    from scalectl.present.summary import summarize_run

    with open_store(db) as store:
        lines, summary["fit"] = summarize_run(store, run_id, run_dir / "curve.png")
    if json_:
        print_json(summary)
    else:
        out.print(f"done: {summary['steps']} steps, pass rate {fmt(summary['first_pass_rate'])} -> "
                  f"{fmt(summary['last_pass_rate'])}, {fmt(summary['flops'])} FLOPs, "
                  f"{fmt(summary['gpu_hours'], 4)} device-hours, {summary['retired_prompts']} prompts retired")
        for line in lines:
            out.print(line, soft_wrap=True, markup=False)


def _note_same_run(store, recipe) -> None:
    """Say so when the store holds a run of the same recipe content and seed: `run` trains a
    new one regardless (`ablate` would reuse or resume it)."""
    from scalectl.launch.runs import ATTACH, RESUME, find_existing

    found = find_existing(store, recipe.content_hash, recipe.seed)
    if found is None:
        return
    action, row = found
    pts = store.points(row["id"])
    at = f" at step {pts[-1]['step']}" if pts else ""
    if action == RESUME:
        what = f"stopped ({row['status']}){at}; `scalectl run --resume {row['name']}` continues it"
    elif action == ATTACH:
        what = f"is {row['status']}{at}"
    else:
        what = f"completed{at}; `scalectl ablate` would reuse it"
    err.print(f"note: run {row['name']} has this recipe and seed and {what}; training a new run",
              highlight=False)


def _check_layout(recipe, kind: str, describe: bool):
    """Refuse a layout the job would refuse at start (:mod:`scalectl.job.layout`); with
    ``describe``, print the role map, the memory estimate and the weight-sync plan.

    Raises:
        UserError: every problem found, one per line.
    """
    from scalectl.job.layout import check_layout, parameter_count

    needs_params = describe or recipe.hardware.memory_gb is not None
    layout = check_layout(recipe, parameter_count(recipe.model) if needs_params else None, kind)
    if describe:
        for line in layout.lines:
            err.print(line, highlight=False)
    if layout.problems:
        raise UserError("the run cannot start as set up:\n  " + "\n  ".join(layout.problems))
    return layout


def _prepare_resume(ref: str, overrides: list[str], db, held: contextlib.ExitStack):
    """Check that run ``ref`` may be resumed, holding its folder's lock from before its
    files are read to the end of the command; apply ``--set budget.*`` overrides.

    A completed run is resumed only with a raised budget (``--set budget.steps=N``
    above the steps it trained): it then continues from its final checkpoint and
    keeps every point it has.

    Returns:
        (the run's row, its recipe with the overrides).

    Raises:
        UserError: no run folder, the folder held by another process, a run whose
            job is alive, a completed run without a raised budget, an override of
            anything but the budget, or a budget already spent.
    """
    from scalectl.job.body import read_job_file, write_job_file
    from scalectl.job.lock import run_folder_lock
    from scalectl.launch.runs import has_job_file, resumable
    from scalectl.recipe.load import resumed_recipe

    with open_store(db) as store:
        info = store.get_run(ref)
    if not has_job_file(info):
        raise UserError(f"run {ref!r} has no run folder to resume from")
    run_dir, name = Path(info["run_dir"]), info["name"]
    held.enter_context(run_folder_lock(run_dir, name))
    with open_store(db) as store:
        info, old = resumable(store, info["id"])                # read again, under the lock
        points = store.points(info["id"])
        recipe = resumed_recipe(old, overrides)
        done_steps = points[-1]["step"] if points else 0
        done_hours = (points[-1].get("gpu_hours") or 0.0) if points else 0.0
        b = recipe.budget
        if info["status"] == "completed" and not overrides:
            reached = (f"budget.steps = {b.steps}" if b.steps is not None and done_steps >= b.steps
                       else f"budget.gpu_hours = {b.gpu_hours}")
            raise UserError(f"run {name} is completed ({reached} reached); to extend it, raise the budget: "
                            f"scalectl run --resume {name} --set budget.steps=N (N > {done_steps})")
        if b.steps is not None and b.steps <= done_steps:
            raise UserError(f"--set budget.steps: budget.steps = {b.steps} must be above the {done_steps} "
                            f"steps run {name} has trained")
        if b.gpu_hours is not None and b.gpu_hours <= done_hours:
            raise UserError(f"--set budget.gpu_hours: budget.gpu_hours = {b.gpu_hours} must be above the "
                            f"{done_hours:.4g} GPU-hours run {name} has used")
        if recipe != old:
            job = read_job_file(run_dir)
            write_job_file(run_dir, db=job["db"], run_id=job["run_id"], recipe=recipe.to_dict())
            store.update_run(info["id"], recipe=recipe.to_dict(), recipe_hash=recipe.content_hash)
            err.print(f"run {name}: budget {budget_text(b)} (was {budget_text(old.budget)})")
    return info, recipe


def _print_dry_run(recipe, kind: str, detach: bool, run_name: str, run_dir: Path, json_: bool,
                   layout=None) -> None:
    """What would be launched: the layout, and what the launcher would submit (:meth:`Launcher.dry_run`)."""
    data: dict = {"recipe": recipe.to_dict(), "hash": recipe.content_hash, "launcher": kind,
                  "run_name": run_name, "run_dir": str(run_dir)}
    if layout is not None:
        from dataclasses import asdict

        data["layout"] = {"lines": layout.lines,
                          "memory": asdict(layout.memory) | {"total": layout.memory.total} if layout.memory else None,
                          "weight_sync": asdict(layout.weight_sync) if layout.weight_sync else None}
    from scalectl.launch.registry import get_launcher

    described = get_launcher(kind).dry_run(recipe, run_name, run_dir, detach=detach)
    data.update(described.data)
    if not json_:
        err.print(described.summary, highlight=False)
        if described.script is not None:
            sys.stdout.write(described.script)   # verbatim: no wrapping
    if json_:
        print_json(data)


def _submit(kind: str, run_id: int, run_name: str, run_dir: Path, recipe, db, json_: bool) -> None:
    """Hand the run to its launcher (:func:`scalectl.launch.runs.submit`) and say where it went."""
    from scalectl.launch.base import RunSpec
    from scalectl.launch.runs import submit

    with open_store(db) as store:
        job = submit(store, [RunSpec(run_id, run_name, run_dir, recipe)], kind)[0]
    if json_:
        print_json({"run": run_name, "run_id": run_id, "launcher": kind, "job_id": job.job_id,
                    "run_dir": str(run_dir), "log": job.log})
    else:
        out.print(f"submitted run {run_name} to {kind} as job {job.job_id}; log {job.log}")
        err.print(f"follow it with `scalectl logs {run_name} --follow`; `scalectl status` lists every run; "
                  f"`scalectl cancel {run_name}` stops it")


def register(app: typer.Typer) -> None:
    """Add ``run`` to the app."""
    app.command()(run)
