"""``scalectl ablate`` and ``scalectl report``: compare recipes at a small budget.

``ablate`` plans the variants (:mod:`scalectl.ablation.planner`), prints the
plan (each variant's changes from the base, the runs, the estimated cost),
reuses stored runs that already train the same recipe hash and seed,
launches the rest (:mod:`scalectl.ablation.campaign`), shows a live table
while they train, and ends with the verdicts against the base
(:mod:`scalectl.ablation.analysis`) and the report (:mod:`scalectl.ablation.report`).
Ctrl-C cancels the ablation's jobs (each saves a checkpoint); the same
command again continues where it stopped.  This module only reads arguments
and prints."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from scalectl.commands.common import (
    DbOption,
    JsonOption,
    err,
    finish_ablation,
    fmt,
    open_store,
    out,
    print_json,
    user_errors,
)
from scalectl.defaults import MARGIN
from scalectl.errors import UserError


def _print_plan(plan, actions: dict, cost: dict, counts: dict) -> None:
    s = plan.spec
    out.print(f"[bold]ablation {s.name}[/bold] ({s.kind}): base {s.base or '-'} on setup {plan.setup}, "
              f"{len(plan.variants[0].seeds)} seed(s) per variant, margin {s.margin:g}", soft_wrap=True)
    if s.overrides:
        out.print("  on every run: " + ", ".join(s.overrides), soft_wrap=True)
    for note in plan.notes:
        out.print(f"  note: {note}", soft_wrap=True)
    width = max(len(v.name) for v in plan.variants)
    for v in plan.variants:
        changes = ["(baseline)"] if v.is_base else [str(c) for c in v.changes]
        out.print(f"[bold]{escape(v.name):<{width}}[/bold]  {escape(changes[0])}", soft_wrap=True)
        for c in changes[1:]:
            out.print(f"{'':<{width}}  {c}", soft_wrap=True, markup=False)
        for r in (x for x in plan.runs if x.variant == v.name):
            action, row = actions.get(r.name, ("new", None))
            what = action if row is None else (
                f"{action} ({row['status']}" + (f", step {row['last_step']}" if row.get("last_step") else "")
                + ")" + ("" if row["name"] == r.name else f": stored as {row['name']}"))
            out.print(f"{'':<{width}}    run {r.name} [{r.recipe_hash}]: {what}", soft_wrap=True, markup=False)
    steps_per = {r.recipe.budget.steps for r in plan.runs}
    train = counts.get("new", 0) + counts.get("resume", 0)
    line = (f"{len(plan.runs)} runs: {counts.get('new', 0)} new, {counts.get('resume', 0)} to resume, "
            f"{counts.get('reuse', 0)} reused, {counts.get('attach', 0)} already running; "
            f"budget {'/'.join(str(x) for x in sorted(steps_per, key=str))} steps per run; "
            f"to train: {cost['steps']:,} steps ({train} runs)")
    if cost["device_hours"] is not None:
        line += (f", about {cost['device_hours']:.4g} device-hours at {cost['rate']:.3g} per step "
                 f"({cost['rate_source']})")
    elif train:
        line += ("; no cost rate: none measured in this store for this hardware, model and batch "
                 "(set device_hours_per_step in the ablation file or --rate)")
    out.print(line, soft_wrap=True)


def _spec(file, leave_one_out: bool, forward: list[str], base: Path | None, name: str | None):
    from scalectl import ablation as ab

    given = sum([file is not None, leave_one_out, bool(forward)])
    if given != 1:
        raise UserError("give exactly one of: an ablation FILE, --leave-one-out, or --forward KEY=V1,V2 "
                        "(repeatable)")
    if file is not None:
        if base is not None:
            raise UserError("--base is for --leave-one-out and --forward; an ablation file names its base")
        spec = ab.read_ablation(file)
        return spec if name is None else replace(spec, name=ab.check_part(name, "--name"))
    base = base or Path(ab.DEFAULT_BASE_RECIPE)
    if leave_one_out:
        return ab.leave_one_out_spec(base, **({"name": name} if name else {}))
    return ab.forward_spec([ab.parse_forward(f) for f in forward], base, name=name)


def _table(rows: list[dict]) -> Table:
    table = Table(title="ablation runs")
    for col in ("variant", "run", "status", "step", "compute", "pass rate", "fitted A"):
        table.add_column(col, justify="right" if col in ("step", "compute", "pass rate", "fitted A") else "left")
    for r in rows:
        step = "-" if r["step"] is None else f"{r['step']}/{r['budget'] or '?'}"
        table.add_row(r["variant"], r["name"], r["status"], step, fmt(r["compute"]), fmt(r["pass_rate"]), fmt(r["A"]))
    return table


def _watch(db, watch, poll_s: float) -> list[dict]:
    """Show the runs until every one has ended (a live table on a terminal, else a line per
    change); return the last rows."""
    from rich.live import Live

    from scalectl.launch.base import ACTIVE

    seen: dict[str, tuple] = {}
    live = Live(console=err, auto_refresh=False, transient=False) if err.is_terminal else None
    if live:
        live.start()
    try:
        while True:
            with open_store(db) as store:
                rows = watch.rows(store)
            if live:
                live.update(_table(rows), refresh=True)
            else:
                for r in rows:
                    if seen.get(r["name"]) != (r["status"], r["step"]):
                        seen[r["name"]] = (r["status"], r["step"])
                        err.print(f"{r['name']}: {r['status']}, step {fmt(r['step'])}, pass rate "
                                  f"{fmt(r['pass_rate'])}, fitted A {fmt(r['A'])}", highlight=False)
            if not any(r["status"] in ACTIVE for r in rows):
                return rows
            time.sleep(poll_s)
    finally:
        if live:
            live.stop()


@user_errors
def ablate(
    file: Annotated[Path | None, typer.Argument(
        metavar="[ABLATION]", help="Ablation file (ablations/*.toml) or preset name (scalerl-loo, ...).")] = None,
    leave_one_out: Annotated[bool, typer.Option(
        "--leave-one-out", help="ScaleRL's seven leave-one-out variants of --base (default the scalerl preset).")] = False,
    forward: Annotated[list[str], typer.Option(
        "--forward", help="KEY=V1,V2,...: each value tried on --base, one axis at a time (repeatable).")] = [],
    base: Annotated[Path | None, typer.Option(help="Base recipe of --leave-one-out / --forward.")] = None,
    name: Annotated[str | None, typer.Option(help="Ablation name (prefix of its run names).")] = None,
    setup: Annotated[Path | None, typer.Option(help="Setup TOML or preset name (default: the ablation's, else tiny-cpu).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override KEY=VALUE on every run (repeatable).")] = [],
    budget_steps: Annotated[int | None, typer.Option("--budget-steps", help="Optimiser steps per run (budget.steps).")] = None,
    repeats: Annotated[int | None, typer.Option(help="Seeds per variant.")] = None,
    launcher: Annotated[str | None, typer.Option(help="local or slurm (default: the setup's launcher.type).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; create and launch nothing.")] = False,
    runs_dir: Annotated[Path, typer.Option(help="Where run folders (and ablation manifests) go.")] = Path("runs"),
    out_dir: Annotated[Path | None, typer.Option("--out", help="Report folder (default reports/NAME).")] = None,
    margin: Annotated[float | None, typer.Option(help=f"Noise margin on A (default: the ablation's, {MARGIN}).")] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples per fit (0: none).")] = 1000,
    rate: Annotated[float | None, typer.Option(help="Device-hours per step for the cost estimate.")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between looks at the runs.")] = 2.0,
    until_decided: Annotated[bool, typer.Option(
        "--until-decided", help="Extend runs and add seeds, stage by stage, until every verdict is decided "
                                "(--budget-steps is the first stage's budget).")] = False,
    max_budget: Annotated[int | None, typer.Option(
        "--max-budget", help="--until-decided: optimiser steps per run at most (default 8 x the first budget).")] = None,
    max_seeds: Annotated[int, typer.Option("--max-seeds", help="--until-decided / --plan: seeds per variant at most.")] = 6,
    total_budget: Annotated[float | None, typer.Option(
        "--total-budget", help="--until-decided: device-hours the ablation may spend in all.")] = None,
    race: Annotated[bool, typer.Option(
        "--race", help="--until-decided: also stop a variant that cannot beat another variant.")] = False,
    level: Annotated[float, typer.Option(
        help="--until-decided / --plan: interval level of the stage decisions (repeated looks).")] = 0.99,
    plan_power: Annotated[bool, typer.Option(
        "--plan", help="Estimate the budget and seeds that resolve a difference of the margin, and their cost.")] = False,
    assume: Annotated[list[str], typer.Option(
        "--assume", help="--plan without a stored base run: C_mid=..,compute_per_step=..,s_fit=..,s_seed=..")] = [],
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Train the variants of an ablation to a small budget, then compare them with the base.

    Prints the plan first; reuses stored runs of the same recipe hash and
    seed (resuming interrupted ones); launches the rest; Ctrl-C cancels them
    (run the same command again to continue); ends with the verdicts and a
    report (HTML + Markdown) in --out.
    """
    from scalectl.ablation import campaign
    from scalectl.ablation import plan as make_plan
    from scalectl.launch.registry import LAUNCHER_TYPES
    from scalectl.store.database import default_db_path

    spec = _spec(file, leave_one_out, forward, base, name)
    overrides = tuple(set_) + ((f"budget.steps={budget_steps}",) if budget_steps is not None else ())
    if until_decided or plan_power:
        from scalectl.commands.until_decided import adaptive_command

        adaptive_command(spec, setup=setup, overrides=overrides, launcher=launcher, runs_dir=runs_dir,
                         out_dir=out_dir, margin=margin, bootstrap=bootstrap, rate=rate, poll=poll,
                         max_budget=max_budget, max_seeds=max_seeds, total_budget=total_budget, race=race,
                         level=level, plan_only=plan_power and not until_decided, assume=assume,
                         dry_run=dry_run, db=db, json_=json_)
        return
    plan = make_plan(spec, setup=setup, overrides=overrides, repeats=repeats)
    from scalectl.job.trackers import check_installed

    check_installed(plan.variants[0].recipe.logging)     # [logging] backends: before any run starts
    kind = launcher or plan.variants[0].recipe.launcher.type
    if kind not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {kind!r} is not one of: {', '.join(LAUNCHER_TYPES)}")
    db = db or default_db_path()
    actions, measured = {}, None
    if db == ":memory:" or Path(db).exists():
        with open_store(db) as store:
            actions = campaign.resolve(store, plan)
            measured = campaign.measured_rate(store, plan.variants[0].recipe)
    cost = campaign.cost(plan, actions, campaign.cost_rate(rate, measured, spec.device_hours_per_step, db))
    plan_json = {"plan": plan.to_dict(), "cost": cost, "launcher": kind,
                 "actions": {n: {"action": a, "run": None if row is None else row["name"]}
                             for n, (a, row) in ((r.name, actions.get(r.name, ("new", None))) for r in plan.runs)}}
    if json_ and dry_run:
        print_json(plan_json)
        return
    if not json_:
        _print_plan(plan, actions, cost, campaign.action_counts(plan, actions))
    if dry_run:
        return
    with open_store(db, create=True) as store:
        actions = campaign.resolve(store, plan)      # again: the store may have moved since the plan
        ids, launched = campaign.launch(store, plan, actions, kind, runs_dir)
        names = {n: store.get_run(i)["name"] for n, i in ids.items()}
    if launched:
        err.print(f"launched {launched} run(s) on {kind}"
                  + (f" (at most {plan.runs[0].recipe.launcher.max_parallel} at once)" if kind == "local" else ""))
    manifest = campaign.manifest(plan, names, db)
    campaign.write_manifest(campaign.manifest_path(runs_dir, spec.name), manifest)
    try:
        rows = _watch(db, campaign.Watch(plan, ids), poll)
    except KeyboardInterrupt:
        err.print("interrupted: cancelling the ablation's jobs (each saves a checkpoint)")
        with open_store(db) as store:
            n = campaign.cancel_all(store, ids, log=lambda m: err.print(m, highlight=False))
        err.print(f"cancelled {n} run(s); run the same command again to continue where it stopped")
        raise typer.Exit(130) from None
    for r in rows:
        if r["status"] != "completed":
            first = (r["error"] or "").splitlines()[0] if r["error"] else ""
            err.print(f"[red]{escape(r['name'])}[/red] ended {r['status']}: {escape(first)}", markup=True)
    finish_ablation(db, manifest, out_dir or Path("reports") / spec.name, bootstrap, margin, json_,
            extra={**plan_json, "runs": {r["name"]: r["status"] for r in rows}})


def register(app: typer.Typer) -> None:
    """Add ``ablate`` to the app."""
    app.command()(ablate)
