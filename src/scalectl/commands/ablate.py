"""``scalectl ablate``: compare recipes at a small budget.

Arguments and rendering.  A fixed ablation is :func:`scalectl.ablation.campaign.prepare`
(the plan: each variant's changes from the base, the runs, the estimated cost, the
stored runs it reuses) then :func:`~scalectl.ablation.campaign.run` (launch, a live
table while the runs train, the verdicts against the base and the report);
``--until-decided`` and ``--plan`` are :mod:`scalectl.ablation.until_decided`'s.
Ctrl-C cancels the ablation's jobs (each saves a checkpoint); the same command
again continues where it stopped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.bounds import MAX_POLL_S, MAX_SEEDS, MAX_STEPS, number
from scalectl.commands.common import (
    BootstrapOption,
    DbOption,
    JsonOption,
    MarginChoiceOption,
    err,
    out,
    print_ablation,
    print_json,
    user_errors,
)
from scalectl.errors import UserError

FileArg = Annotated[Path | None, typer.Argument(
    metavar="[ABLATION]", help="Ablation file (ablations/*.toml) or preset name (scalerl-loo, ...).")]
LooOption = Annotated[bool, typer.Option(
    "--leave-one-out", help="ScaleRL's seven leave-one-out variants of --base (default the scalerl preset).")]
ForwardOption = Annotated[list[str], typer.Option(
    "--forward", help="KEY=V1,V2,...: each value tried on --base, one axis at a time (repeatable).")]
BaseOption = Annotated[Path | None, typer.Option(help="Base recipe of --leave-one-out / --forward.")]
NameOption = Annotated[str | None, typer.Option(help="Ablation name (prefix of its run names).")]
SetupOption = Annotated[Path | None, typer.Option(help="Setup TOML or preset name (default: the ablation's, else tiny-cpu).")]
SetOption = Annotated[list[str], typer.Option("--set", help="Override KEY=VALUE on every run (repeatable).")]
StepsOption = Annotated[int | None, typer.Option(
    "--budget-steps", callback=number(1, MAX_STEPS), help="Optimiser steps per run (budget.steps).")]
RepeatsOption = Annotated[int | None, typer.Option(callback=number(1, MAX_SEEDS), help="Seeds per variant.")]
LauncherOption = Annotated[str | None, typer.Option(help="local or slurm (default: the setup's launcher.type).")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the plan; create and launch nothing.")]
RunsDirOption = Annotated[Path, typer.Option(help="Where run folders (and ablation manifests) go.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Report folder (default reports/NAME).")]
PollOption = Annotated[float, typer.Option(callback=number(0.0, MAX_POLL_S, lo_open=True),
                                           help="Seconds between looks at the runs.")]
RateOption = Annotated[float | None, typer.Option(callback=number(0.0, lo_open=True),
                                                  help="Device-hours per step for the cost estimate.")]
UntilOption = Annotated[bool, typer.Option("--until-decided", help=(
    "Extend runs and add seeds, stage by stage, until every verdict is decided "
    "(--budget-steps is the first stage's budget)."))]
MaxBudgetOption = Annotated[int | None, typer.Option(
    "--max-budget", callback=number(1, MAX_STEPS), help="--until-decided: optimiser steps per run at most (default 8 x the first budget).")]
MaxSeedsOption = Annotated[int, typer.Option("--max-seeds", callback=number(1, MAX_SEEDS),
                                             help="--until-decided / --plan: seeds per variant at most.")]
TotalOption = Annotated[float | None, typer.Option(
    "--total-budget", callback=number(0.0, lo_open=True), help="--until-decided: device-hours the ablation may spend in all.")]
RaceOption = Annotated[bool, typer.Option("--race", help="--until-decided: also stop a variant that cannot beat another variant.")]
LevelOption = Annotated[float, typer.Option(
    callback=number(0.0, 1.0, lo_open=True, hi_open=True), help="--until-decided / --plan: interval level of the stage decisions (repeated looks).")]
PlanOption = Annotated[bool, typer.Option(
    "--plan", help="Estimate the budget and seeds that resolve a difference of the margin, and their cost.")]
AssumeOption = Annotated[list[str], typer.Option("--assume", help=(
    "--plan: state the base: C_mid=..,compute_per_step=.. (fit-axis units),s_fit=..,s_seed=..,seconds_per_step=.."))]
FromRunOption = Annotated[str | None, typer.Option(
    "--from-run", help="--plan: take the base's curve, compute and time per step from this stored run.")]


@user_errors
def ablate(
    file: FileArg = None, leave_one_out: LooOption = False, forward: ForwardOption = [],
    base: BaseOption = None, name: NameOption = None, setup: SetupOption = None, set_: SetOption = [],
    budget_steps: StepsOption = None, repeats: RepeatsOption = None, launcher: LauncherOption = None,
    dry_run: DryRunOption = False, runs_dir: RunsDirOption = Path("runs"), out_dir: OutOption = None,
    margin: MarginChoiceOption = None, bootstrap: BootstrapOption = 1000, rate: RateOption = None, poll: PollOption = 2.0,
    until_decided: UntilOption = False, max_budget: MaxBudgetOption = None, max_seeds: MaxSeedsOption = 6,
    total_budget: TotalOption = None, race: RaceOption = False, level: LevelOption = 0.99,
    plan_power: PlanOption = False, assume: AssumeOption = [], from_run: FromRunOption = None,
    db: DbOption = None, json_: JsonOption = False,
) -> None:
    """Train the variants of an ablation to a small budget, then compare them with the base.

    Prints the plan first; reuses stored runs of the same recipe hash and
    seed (resuming interrupted ones); launches the rest; Ctrl-C cancels them
    (run the same command again to continue); ends with the verdicts and a
    report (HTML + Markdown) in --out.
    """
    from scalectl.store.database import default_db_path

    spec = _spec(file, leave_one_out, forward, base, name)
    if margin is not None:                  # recorded in the manifest: `scalectl report` later says the same
        spec = replace(spec, margin=margin, margin_where=f"given: --margin {margin}")
    planned = {"setup": setup, "launcher": launcher, "db": db or default_db_path(),
               "overrides": tuple(set_) + ((f"budget.steps={budget_steps}",) if budget_steps is not None else ())}
    ran = {"runs_dir": runs_dir, "out_dir": out_dir, "bootstrap": bootstrap, "poll": poll}
    if until_decided or plan_power:
        from scalectl.ablation import until_decided as until

        staged = until.prepare(spec, **planned, max_budget=max_budget, max_seeds=max_seeds,
                               total_budget=total_budget, race=race, level=level, rate=rate)
        if plan_power and not until_decided:
            _print_power(spec.name, until.power(staged, until.parse_assume(assume), from_run), json_)
        elif not dry_run:
            _until_decided(staged, ran, json_)
        elif not json_:
            from scalectl.present.ablation import staged_line

            _log(staged_line(staged))
        return
    from scalectl.ablation import campaign

    prepared = campaign.prepare(spec, **planned, repeats=repeats, rate=rate)
    if json_ and dry_run:
        print_json(prepared.to_dict())
        return
    if not json_:
        from scalectl.present.ablation import print_plan

        print_plan(out, prepared)
    if not dry_run:
        _run(prepared, ran, json_)


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


def _log(message: str) -> None:
    err.print(message, highlight=False)


def _run(prepared, ran: dict, json_: bool) -> None:
    from scalectl.ablation import campaign
    from scalectl.present.ablation import (
        CampaignProgress,
        run_key,
        run_line,
        runs_table,
    )
    from scalectl.present.watch import LiveRows

    with LiveRows(err, runs_table, run_line, run_key) as view:
        outcome = campaign.run(prepared, **ran, progress=CampaignProgress(err, view))
    if outcome.interrupted:
        err.print(f"cancelled {outcome.cancelled} run(s); run the same command again to continue where it stopped")
        raise typer.Exit(130)
    print_ablation(outcome.result, outcome.report, outcome.to_dict() if json_ else None)


def _print_power(name: str, p: dict, json_: bool) -> None:
    from scalectl.present.ablation import print_power

    if json_:
        print_json({"ablation": name, "power": p})
    else:
        print_power(out, err, p, name)


def _until_decided(staged, ran: dict, json_: bool) -> None:
    from scalectl.ablation import until_decided as until
    from scalectl.present.ablation import staged_line

    if not json_:
        _log(staged_line(staged))
    outcome = until.run(staged, **ran, log=_log)
    if outcome.interrupted:
        err.print(f"cancelled {outcome.cancelled} run(s); run the same command again to resume after the last "
                  "recorded stage")
        raise typer.Exit(130)
    if json_:
        print_json(outcome.to_dict())
    else:
        out.print(outcome.text, soft_wrap=True, highlight=False, markup=False)
        err.print(f"wrote {outcome.report}")


def register(app: typer.Typer) -> None:
    """Add ``ablate`` to the app."""
    app.command()(ablate)
