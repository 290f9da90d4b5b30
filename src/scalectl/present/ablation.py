"""What ``scalectl ablate`` and ``scalectl report`` show: the plan, the runs while they train,
the verdicts against the base, and the power plan of ``--plan``.

Functions of the objects :mod:`scalectl.ablation` returns (read by attribute, so that this
module needs none of it) and of rich consoles.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scalectl.display import format_estimate, format_number


def print_plan(console: Console, prepared) -> None:
    """The plan of an ablation (:class:`scalectl.ablation.campaign.Prepared`): the base, each
    variant's changes, each run and what becomes of it (new, resume, reuse, attach), and the
    steps and device-hours still to train."""
    plan, actions, cost, counts = prepared.plan, prepared.actions, prepared.cost, prepared.counts()
    s = plan.spec
    console.print(f"[bold]ablation {s.name}[/bold] ({s.kind}): base {s.base or '-'} on setup {plan.setup}, "
                  f"{len(plan.variants[0].seeds)} seed(s) per variant, {margin_text(s)}", soft_wrap=True)
    if s.overrides:
        console.print("  on every run: " + ", ".join(s.overrides), soft_wrap=True)
    for note in plan.notes:
        console.print(f"  note: {note}", soft_wrap=True)
    width = max(len(v.name) for v in plan.variants)
    for v in plan.variants:
        changes = ["(baseline)"] if v.is_base else [str(c) for c in v.changes]
        console.print(f"[bold]{escape(v.name):<{width}}[/bold]  {escape(changes[0])}", soft_wrap=True)
        for c in changes[1:]:
            console.print(f"{'':<{width}}  {c}", soft_wrap=True, markup=False)
        for r in (x for x in plan.runs if x.variant == v.name):
            console.print(f"{'':<{width}}    run {r.name} [{r.recipe_hash}]: {_action(r.name, actions)}",
                          soft_wrap=True, markup=False)
    console.print(_cost_line(plan, cost, counts), soft_wrap=True)


def _action(name: str, actions: dict) -> str:
    action, row = actions.get(name, ("new", None))
    if row is None:
        return action
    return (f"{action} ({row['status']}" + (f", step {row['last_step']}" if row.get("last_step") else "")
            + ")" + ("" if row["name"] == name else f": stored as {row['name']}"))


def _cost_line(plan, cost: dict, counts: dict) -> str:
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
    return line


def runs_table(rows: list[dict]) -> Table:
    """The ablation's runs while they train (rows of :meth:`scalectl.ablation.campaign.Watch.rows`)."""
    table = Table(title="ablation runs")
    for col in ("variant", "run", "status", "step", "compute", "pass rate", "fitted A"):
        table.add_column(col, justify="right" if col in ("step", "compute", "pass rate", "fitted A") else "left")
    for r in rows:
        step = "-" if r["step"] is None else f"{r['step']}/{r['budget'] or '?'}"
        table.add_row(r["variant"], r["name"], r["status"], step,
                      *(format_number(r[k], decimals=True) for k in ("compute", "pass_rate", "A")))
    return table


def run_line(r: dict) -> str:
    """One run of the ablation as a line (off a terminal)."""
    step, rate, a = (format_number(r[k], decimals=True) for k in ("step", "pass_rate", "A"))
    return f"{r['name']}: {r['status']}, step {step}, pass rate {rate}, fitted A {a}"


def run_key(r: dict) -> tuple:
    """A run's identity and the state whose change prints a line: (name, (status, step))."""
    return r["name"], (r["status"], r["step"])


def print_failures(console: Console, rows: list[dict]) -> None:
    """A line for each run that ended other than completed, with the first line of its error."""
    for r in rows:
        if r["status"] != "completed":
            first = (r["error"] or "").splitlines()[0] if r["error"] else ""
            console.print(f"[red]{escape(r['name'])}[/red] ended {r['status']}: {escape(first)}", markup=True)


class CampaignProgress:
    """A campaign's progress (:class:`scalectl.ablation.campaign.Progress`) on ``console``: a live
    table of the runs (``view``, a :class:`scalectl.present.watch.LiveRows`), then the runs that
    did not complete (:func:`print_failures`)."""

    def __init__(self, console: Console, view):
        self.console, self.view = console, view

    def log(self, message: str) -> None:
        self.console.print(message, highlight=False)

    def runs(self, rows: list[dict]) -> None:
        self.view.show(rows)

    def watched(self, rows: list[dict] | None) -> None:
        self.view.stop()
        print_failures(self.console, rows or [])


def margin_text(spec) -> str:
    """The margin an ablation plan (:class:`scalectl.ablation.planner.AblationSpec`) will judge by."""
    if spec.margin == "auto":
        return "margin auto (measured from the baseline recipe's seeds when the runs are done)"
    where = spec.margin_where or "the paper's default"
    return f"margin {spec.margin:g} ({where})"


def verdict_table(result) -> Table:
    """Every variant of an :class:`scalectl.ablation.analysis.AblationResult` against its
    baseline: A with its interval, B, C_mid, dA with its interval, the verdict."""
    table = Table(title=f"{result.name}: variants against {result.baseline} (margin {result.margin:.3g})")
    for col in ("variant", "A", "B", "C_mid", "dA", "verdict"):
        table.add_column(col, justify="left" if col in ("variant", "verdict") else "right")
    for v in result.variants:
        if v.curve is None:
            table.add_row(v.name, "-", "-", "-", "-", f"not fitted: {v.error}")
            continue
        f = v.curve.fit
        row = result.comparison.row(v.name) if result.comparison else None
        if row is None or row.verdict == "baseline":
            d, verdict = "-", "-" if row is None else "baseline"
        else:
            lo, hi = row.delta_A_interval
            d, verdict = f"{row.delta_A:+.3f} [{lo:+.3f}, {hi:+.3f}]", row.verdict
        table.add_row(v.name, format_estimate(f.A, f.interval("A")), f"{f.B:.2f}", f"{f.C_mid:.4g}", d, verdict)
    return table


def staged_line(staged) -> str:
    """What an adaptive ablation (:class:`scalectl.ablation.until_decided.Staged`) is about to do."""
    plan, limits = staged.plan, staged.limits
    return (f"adaptive ablation {plan.spec.name}: {len(plan.variants)} arms (baseline: {plan.baseline}), first stage "
            f"{staged.initial} steps x1 seed; at most {limits.max_budget} steps and {limits.max_seeds} seeds per variant"
            + (f", {staged.total_budget:g} device-hours in all" if staged.total_budget else "")
            + f"; margin {limits.margin:.3g}" + (f" ({staged.margin.where})" if staged.margin else "")
            + f", launcher {staged.kind}")


def _print_margin_plan(out: Console, p: dict) -> None:
    """The margin of the plan and where it came from; the seed runs that would measure the
    user's own (``p["margin_seeds"]``: :func:`scalectl.ablation.until_decided.margin_seeds`)."""
    if p.get("margin_source"):
        out.print(f"  margin {p['margin']:.3g} ({p['margin_source']['where']})", soft_wrap=True, highlight=False,
                  markup=False)
    m = p.get("margin_seeds")
    if not m:
        return
    say = lambda text: out.print(text, soft_wrap=True, highlight=False, markup=False)  # noqa: E731
    have = f"{len(m['have'])} completed run(s) of the base recipe at {m['budget_steps']} steps (hash {m['recipe_hash']})"
    short = "" if m.get("identifies", True) else (
        f"at {m['ablation_budget_steps']} steps (the ablation's budget) the base reaches about {m['reach']:.1f} x "
        f"C_mid, short of the {m['rule_reach']:g} x C_mid where a ceiling counts as identified (docs/fitting.md): "
        f"`scalectl margin` and --margin auto would leave runs of that budget out; at {m['budget_steps']} steps: ")
    then = ("--margin auto" if m.get("identifies", True) else
            f"`scalectl margin` (recipe {m['recipe_hash']}) and --margin VALUE, or this ablation at --budget-steps "
            f"{m['budget_steps']} with --margin auto")
    if not m["more"]:
        say(f"  your own margin: {short}{have} in the store: {then} measures it")
        return
    cost = "" if m["device_hours"] is None else f", about {m['device_hours']:.4g} device-hours"
    say(f"  your own margin: {short}{have}; {m['more']} more seed(s) measure it{cost}, then {then}:")
    stored = {int(k): v for k, v in (m.get("stored") or {}).items()}
    for seed, command in zip(m["seeds"], m["commands"]):
        s = stored.get(seed)
        note = "" if s is None else (f"   # {'extends' if s['action'] == 'extend' else 'resumes'} {s['run']} "
                                     f"({s['steps']} steps trained)")
        say(f"    {command}{note}")


def _wall(seconds, per_step, parallel: int) -> str:
    if seconds is None:
        return ""
    from scalectl.display import duration_text

    return (f", wall-clock about {duration_text(seconds)} ({per_step:.3g} s per step, {parallel} run(s) at a "
            "time: launcher.max_parallel)")


def print_power(out: Console, err: Console, p: dict, name: str) -> None:
    """The power plan of ``ablate --plan`` (:func:`scalectl.ablation.staged.power_plan`): the budget
    in steps with what it reaches, the seeds, the cost in device-hours and wall-clock, and what its
    terms mean; its warning on ``err``."""
    from scalectl.display import format_number

    runs, steps = p["arms"] * p["seeds"], p["arms"] * p["seeds"] * p["budget_steps"]
    cost = ("no cost rate (--rate)" if p["device_hours"] is None
            else f"about {p['device_hours']:.4g} device-hours ({p['rate']:.3g} per step)")
    secs, parallel = p.get("seconds_per_step"), p.get("parallel", 1)
    say = lambda text: out.print(text, soft_wrap=True, highlight=False, markup=False)  # noqa: E731
    say(f"power plan for {name} from {p['source']}:")
    if p.get("warning"):
        err.print(f"[yellow]warning:[/yellow] {escape(p['warning'])}", soft_wrap=True, highlight=False)
    say(f"  budget {p['budget_steps']:,} steps per run (reaches {p['reach']:.1f} x C_mid; C_mid "
        f"{format_number(p['C_mid'], 3)} {p['axis']} at {format_number(p['compute_per_step'], 3)} per step), "
        f"{p['seeds']} seed(s) per arm, {p['arms']} arms")
    say(f"  {runs} runs, {steps:,} steps: {cost}{_wall(p.get('wall_seconds'), secs, parallel)}"
        + (f"; capped by --max-budget/--max-seeds: resolving the margin needs {p['budget_uncapped']:,} steps "
           f"x {p['seeds_uncapped']} seeds" if p["capped"] else ""))
    say(f"  dA half-width with these seeds {p['half_width']:.4f} (target <= margin/2 = {p['margin'] / 2:.4f}); "
        f"sd of A per run: s_fit {p['s_fit']:.4f}, s_seed {p['s_seed']:.4f}")
    _print_margin_plan(out, p)
    if p["worst_case_hours"] is not None:
        say(f"  --until-decided spends at most {p['worst_case_hours']:.4g} device-hours"
            + _wall(p.get("worst_case_seconds"), secs, parallel)
            + " (every arm to --max-budget with --max-seeds); usually far less")
    say("where:")
    for term, meaning in (p.get("terms") or {}).items():
        say(f"  {term}: {meaning}")
