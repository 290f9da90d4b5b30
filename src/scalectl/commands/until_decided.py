"""``scalectl ablate --until-decided`` and ``--plan``: spend compute until the verdicts are decided.

Arguments and rendering; the runs, stages and power plan are
:mod:`scalectl.ablation.staged`'s.  Every stage goes to the store's
``ablation_stages`` table as soon as it is decided; running the same command
again after a Ctrl-C resumes after the last recorded stage.
"""

from __future__ import annotations

import json
from pathlib import Path

from scalectl.ablation.staged import (
    StoreBackend,
    power_plan,
    reopen_undecided,
    state_from_stages,
    summary,
    total_budget_line,
)
from scalectl.ablation.staged import (
    needs as _needs,
)
from scalectl.ablation.staged import (
    write_manifest as _write_manifest,
)
from scalectl.commands.common import err, open_store, out, print_json
from scalectl.errors import UserError


def _fmt_step(h: dict) -> str:
    a = "-" if h["A"] is None else f"A {h['A']:.3f}"
    d = "" if h["dA"] is None else f" dA {h['dA']:+.3f} [{h['dA_lo']:+.3f}, {h['dA_hi']:+.3f}]"
    return f"{h['budget']}x{h['seeds']} ({a}{d}) {h['action']}"


def render(s: dict, name: str, ended: str, needs: list[str]) -> str:
    """The adaptive report as Markdown (also printed)."""
    lines = [f"# {name}: adaptive ablation", "",
             f"{s['stages']} stage(s), ended: {ended}. Budgets are optimiser steps per run x seeds.", "",
             "| variant | path (stage: budget x seeds, A, dA, action) | verdict |", "|---|---|---|"]
    for v in s["variants"]:
        path = " -> ".join(f"{h['stage']}: {_fmt_step(h)}" for h in v["path"])
        lines.append(f"| {v['variant']} | {path} | {'baseline' if v['is_base'] else v['verdict']} |")
    lines.append("")
    for v in s["variants"]:
        if not v["is_base"]:
            lines.append(f"- {v['variant']}: {v['verdict']}" + (f": {v['reason']}" if v["reason"] else ""))
    lines.append("")
    fd = s["fixed_design"]
    share = "" if s["saved_share"] is None else f" ({s['saved_share']:.0%} saved)"
    lines.append(f"Spent {s['spent_hours']:.4g} device-hours; training every variant to the largest budget used "
                 f"({fd['budget']} steps x {fd['seeds']} seeds) would have spent {s['fixed_hours']:.4g}{share}.")
    if needs:
        lines += ["", "What the variants without a verdict would need:"]
    for n in needs:
        lines.append(f"- {n}")
    return "\n".join(lines) + "\n"


def print_power(p: dict, name: str) -> None:
    cost = "no cost rate (--rate)" if p["device_hours"] is None else f"about {p['device_hours']:.4g} device-hours"
    out.print(f"power plan for {name} from {p['source']}:", soft_wrap=True, highlight=False)
    if p.get("warning"):
        err.print(f"[yellow]warning:[/yellow] {p['warning']}", soft_wrap=True, highlight=False)
    out.print(f"  budget {p['budget_steps']} steps per run (reaches {p['reach']:.1f} x C_mid), "
              f"{p['seeds']} seed(s) per arm, {p['arms']} arms: {cost}"
              + (f" (capped by --max-budget/--max-seeds: resolving the margin needs {p['budget_uncapped']} steps "
                 f"x {p['seeds_uncapped']} seeds)" if p["capped"] else ""), soft_wrap=True, highlight=False)
    out.print(f"  dA half-width with these seeds {p['half_width']:.4f} (target <= margin/2 = {p['margin'] / 2:.4f}); "
              f"sd of A per run: fit {p['s_fit']:.4f}, seed-to-seed {p['s_seed']:.4f}", soft_wrap=True,
              highlight=False)
    if p["worst_case_hours"] is not None:
        out.print(f"  --until-decided spends at most {p['worst_case_hours']:.4g} device-hours "
                  "(every arm to --max-budget with --max-seeds); usually far less", soft_wrap=True, highlight=False)


# --------------------------------------------------------------------------- the command body


def parse_assume(values: list[str]) -> dict[str, float]:
    """``C_mid=0.1,s_fit=0.004`` (repeatable) -> dict; raises UserError naming the allowed keys."""
    allowed = ("C_mid", "compute_per_step", "s_fit", "s_seed")
    out_: dict[str, float] = {}
    for v in values:
        for part in filter(None, v.split(",")):
            k, sep, raw = part.partition("=")
            if not sep or k.strip() not in allowed:
                raise UserError(f"--assume {part!r}: expected KEY=NUMBER with KEY one of: {', '.join(allowed)}")
            try:
                out_[k.strip()] = float(raw)
            except ValueError:
                raise UserError(f"--assume {part!r}: {raw!r} is not a number") from None
    return out_


def run_until_decided(*, db: str, plan, kind: str, runs_dir: Path, out_dir: Path, limits, initial: int,
                      total_budget: float | None, rate: float | None, bootstrap: int, level: float,
                      poll: float, json_: bool) -> None:
    """The adaptive loop over the store; records stages, resumes from them, writes the report."""
    import typer

    from scalectl.ablation.adaptive import run_loop

    name = plan.spec.name
    names = [v.name for v in plan.variants]
    baseline = plan.baseline
    backend = StoreBackend(db, plan, kind, runs_dir, rate, poll_s=poll, log=lambda m: err.print(m, highlight=False))
    with open_store(db, create=True) as store:
        rows = store.stages(name)
    state = state_from_stages(rows, baseline, names, initial)
    reopened = reopen_undecided(rows, state, limits)
    if reopened:
        err.print(f"reopening {', '.join(reopened)}: stopped undecided, with something left to try under "
                  f"--max-budget {limits.max_budget} --max-seeds {limits.max_seeds}", highlight=False, soft_wrap=True)
    for n, a in state.arms.items():
        a.trained = backend.trained(n)
    state.spent_hours = backend.spent_hours()
    if rows:
        err.print(f"resuming adaptive ablation {name} at stage {state.stage} "
                  f"({state.spent_hours:.4g} device-hours spent so far)")
    axis = plan.variants[0].recipe.fit.axis
    section = plan.variants[0].recipe.fit
    fit_kw = {"bootstrap": bootstrap, "level": level, "axis": axis,
              "min_compute": float(section.min_compute or 0.0)}

    def record(stage) -> None:
        keep = {"variant", "is_base", "budget", "seeds", "A", "A_lo", "A_hi", "dA", "dA_lo", "dA_hi", "flags",
                "action", "verdict", "reason", "next_budget", "next_seeds", "seed_sd", "trained_steps", "fit"}
        with open_store(db) as store:
            store.add_stage(name, stage.stage, [{k: v for k, v in r.items() if k in keep} for r in stage.rows],
                            backend.spent_hours())
        for r in stage.rows:
            d = "" if r["dA"] is None else f" dA {r['dA']:+.3f} [{r['dA_lo']:+.3f}, {r['dA_hi']:+.3f}]"
            err.print(f"stage {stage.stage} {r['variant']}: {r['budget']} steps x{r['seeds']}{d} -> {r['action']}"
                      f" ({r['verdict']}){': ' + r['reason'] if r['reason'] else ''}", highlight=False,
                      soft_wrap=True)

    _write_manifest(db, plan, runs_dir)
    try:
        result = run_loop(backend, state, limits, total_budget=total_budget, fit_kw=fit_kw, record=record,
                          on_stage=lambda m: err.print(m, highlight=False, soft_wrap=True))
    except KeyboardInterrupt:
        err.print("interrupted: cancelling the ablation's jobs (each saves a checkpoint)")
        n = backend.cancel_all()
        err.print(f"cancelled {n} run(s); run the same command again to resume after the last recorded stage")
        raise typer.Exit(130) from None
    _write_manifest(db, plan, runs_dir)
    with open_store(db) as store:
        rows = store.stages(name)
    hps = {n: backend.hours_per_step(n) for n in names}
    s = summary(rows, hps, backend.spent_hours(), limits.margin)
    needs = _needs(rows, result.state, backend, limits)
    if result.ended == "total budget":
        needs.insert(0, total_budget_line(result.state, backend, total_budget))
    text = render(s, name, result.ended, needs)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "adaptive.md").write_text(text)
    (out_dir / "adaptive.json").write_text(json.dumps({**s, "ended": result.ended, "needs": needs}, indent=2))
    if json_:
        print_json({**s, "ended": result.ended, "needs": needs, "report": str(out_dir / "adaptive.md")})
    else:
        out.print(text, soft_wrap=True, highlight=False, markup=False)
        err.print(f"wrote {out_dir / 'adaptive.md'}")


def adaptive_command(spec, *, setup, overrides, launcher, runs_dir: Path, out_dir, margin, bootstrap: int,
                     rate, poll: float, max_budget, max_seeds: int, total_budget, race: bool, level: float,
                     plan_only: bool, assume: list[str], dry_run: bool, db, json_: bool) -> None:
    """``ablate --until-decided`` / ``ablate --plan``: check the options, plan, then loop or estimate.

    Raises:
        UserError: a bad option value (naming it and what is allowed), or a
            plan that does not load.
    """
    from scalectl.ablation import plan as make_plan
    from scalectl.ablation.decisions import Limits
    from scalectl.launch.registry import LAUNCHER_TYPES
    from scalectl.store.database import default_db_path

    if max_seeds < 1:
        raise UserError(f"--max-seeds {max_seeds} must be >= 1")
    if total_budget is not None and total_budget <= 0:
        raise UserError(f"--total-budget {total_budget} must be > 0 device-hours")
    if not 0 < level < 1:
        raise UserError(f"--level {level} must lie strictly between 0 and 1")
    plan = make_plan(spec, setup=setup, overrides=overrides, repeats=max_seeds)
    first = plan.variants[0].recipe
    initial = first.budget.steps
    if initial is None:
        raise UserError("--until-decided needs a step budget per run: give --budget-steps N")
    if max_budget is None:
        max_budget = 8 * initial
    if max_budget < initial:
        raise UserError(f"--max-budget {max_budget} is below the first stage's budget {initial} steps")
    kind = launcher or first.launcher.type
    if kind not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {kind!r} is not one of: {', '.join(LAUNCHER_TYPES)}")
    limits = Limits(max_budget=max_budget, max_seeds=max_seeds, margin=margin or spec.margin,
                    step_multiple=first.eval.every_steps, race=race)
    db = db or default_db_path()
    if rate is None:
        rate = spec.device_hours_per_step
        from scalectl.curve.simulated import is_simulated, parse_spec

        if rate is None and is_simulated(first.model.path):
            rate = parse_spec(first.model.path).hours_per_step
        if rate is None and Path(db).exists():
            from scalectl.ablation.campaign import measured_rate

            with open_store(db) as store:
                m = measured_rate(store, first)
            rate = None if m is None else m[0]
    if plan_only:
        p = power_plan(db, plan, limits, rate, parse_assume(assume), level)
        if json_:
            print_json({"ablation": spec.name, "power": p})
        else:
            print_power(p, spec.name)
        return
    if not json_:
        err.print(f"adaptive ablation {spec.name}: {len(plan.variants)} arms (baseline: {plan.baseline}), first stage "
                  f"{initial} steps x1 seed; at most {max_budget} steps and {max_seeds} seeds per variant"
                  + (f", {total_budget:g} device-hours in all" if total_budget else "")
                  + f"; margin {limits.margin:g}, launcher {kind}", highlight=False, soft_wrap=True)
    if dry_run:
        return
    run_until_decided(db=db, plan=plan, kind=kind, runs_dir=runs_dir,
                      out_dir=out_dir or Path("reports") / spec.name, limits=limits, initial=initial,
                      total_budget=total_budget, rate=rate, bootstrap=bootstrap, level=level, poll=poll,
                      json_=json_)
