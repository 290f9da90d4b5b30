"""``scalectl ablate`` and ``scalectl report``: compare recipes at a small budget.

``ablate`` plans the variants (:mod:`scalectl.ablation`), prints the plan
(each variant's changes from the base, the runs, the estimated cost), reuses
stored runs that already train the same recipe hash and seed (completed ones
as they are, interrupted ones resumed from their checkpoints), launches the
rest through the launcher (local detached processes, at most
``launcher.max_parallel`` at once; Slurm: one job array), shows a live table
while they train, and ends with the verdicts against the base and the report
(:mod:`scalectl.report`).  Ctrl-C cancels the ablation's jobs (each saves a
checkpoint); the same command again continues where it stopped.

The runs an ablation uses are recorded in ``RUNS_DIR/.ablations/NAME.json``
(its manifest: the plan, with the stored run standing for each planned run);
runs it creates are named ``<ablation>--<variant>--s<seed>``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from scalectl.commands.common import DbOption, JsonOption, err, fmt, open_store, out, print_json, user_errors
from scalectl.errors import UserError

MANIFEST_DIR = ".ablations"


def manifest_path(runs_dir: str | Path, name: str) -> Path:
    """Where the manifest of ablation ``name`` lives: ``RUNS_DIR/.ablations/NAME.json``."""
    return Path(runs_dir) / MANIFEST_DIR / f"{name}.json"


def _write_manifest(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


# --------------------------------------------------------------------------- plan and cost


def measured_rate(store, recipe) -> tuple[float, int] | None:
    """Device-hours per optimiser step measured on completed runs of this store
    that share the recipe's hardware class, model, batch and generation budget:
    (median of last-point GPU-hours / last step, number of runs), or None.
    Evaluation time is not in GPU-hours (:mod:`scalectl.rl.accounting`)."""
    key = (recipe.hardware.name, recipe.model.path, recipe.batch.prompts_per_step,
           recipe.batch.generations_per_prompt, recipe.length.max_new_tokens)
    rates = []
    for r in store.list_runs():
        rec = r.get("recipe") or {}
        if r["status"] != "completed" or not rec or not r.get("last_step") or not r.get("last_gpu_hours"):
            continue
        k = (rec["hardware"]["name"], rec["model"]["path"], rec["batch"]["prompts_per_step"],
             rec["batch"]["generations_per_prompt"], rec["length"]["max_new_tokens"])
        if k == key:
            rates.append(r["last_gpu_hours"] / r["last_step"])
    return (statistics.median(rates), len(rates)) if rates else None


def _cost(plan, actions: dict, rate: tuple[float, str] | None) -> dict:
    """Steps and device-hours still to train: full budget for new runs, the
    remainder for resumed ones, nothing for reused or attached ones."""
    steps, unknown, gpu_budget = 0, 0, 0.0
    for r in plan.runs:
        action, row = actions.get(r.name, ("new", None))
        if action in ("reuse", "attach"):
            continue
        b = r.recipe.budget
        done = (row or {}).get("last_step") or 0
        if b.steps is not None:
            steps += max(0, b.steps - done)
        else:
            unknown += 1
            gpu_budget += b.gpu_hours or 0.0
    hours = None if rate is None else steps * rate[0] + gpu_budget
    return {"steps": steps, "runs_without_step_budget": unknown, "device_hours": hours,
            "rate": None if rate is None else rate[0], "rate_source": None if rate is None else rate[1]}


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


def _resolve(store, plan) -> dict:
    """Planned run name -> (action, stored run or None)."""
    from scalectl.runs import find_existing

    actions = {}
    for r in plan.runs:
        found = find_existing(store, r.recipe_hash, r.seed, prefer=r.name)
        if found is None:
            actions[r.name] = ("new", None)
            continue
        pts = store.points(found[1]["id"])
        actions[r.name] = (found[0], dict(found[1], last_step=pts[-1]["step"] if pts else None))
    return actions


# --------------------------------------------------------------------------- launching and watching


def _launch(store, plan, actions: dict, kind: str, runs_dir: Path) -> dict[str, int]:
    """Create the new runs, then submit new and resumed ones together
    (``submit_many``: one Slurm job array).  Returns planned name -> run id."""
    from scalectl.launch.base import RunSpec
    from scalectl.launch.registry import get_launcher
    from scalectl.recipe import Recipe
    from scalectl.runs import create_run, unique_name

    ids, specs = {}, []
    for r in plan.runs:
        action, row = actions[r.name]
        if action == "new":
            name = unique_name(store, r.name)
            run_id, run_dir = create_run(store, r.recipe, name, runs_dir, launcher=kind)
            ids[r.name] = run_id
            specs.append(RunSpec(run_id, name, run_dir, r.recipe))
        else:
            ids[r.name] = row["id"]
            if action == "resume":
                from scalectl.job import read_job_file

                recipe = Recipe.model_validate(read_job_file(Path(row["run_dir"]))["recipe"])
                specs.append(RunSpec(row["id"], row["name"], Path(row["run_dir"]), recipe))
    if not specs:
        return ids
    launcher = get_launcher(kind)
    for s in specs:
        store.update_run(s.run_id, status="pending", launcher=kind, error=None, ended=None)
    try:
        jobs = launcher.submit_many(specs)
    except BaseException as exc:
        for s in specs:
            store.update_run(s.run_id, status="failed", error=f"submission failed: {exc}")
        raise
    for s, job in zip(specs, jobs):
        store.add_job_id(s.run_id, job.job_id)
    err.print(f"launched {len(specs)} run(s) on {kind}"
              + (f" (at most {specs[0].recipe.launcher.max_parallel} at once)" if kind == "local" else ""))
    return ids


class _Watch:
    """Polls the store for the ablation's runs and renders the live table."""

    def __init__(self, plan, ids: dict[str, int]):
        self.plan, self.ids = plan, ids
        self.fits: dict[int, tuple[int, float | None]] = {}
        self.seen: dict[int, tuple] = {}

    def rows(self, store) -> list[dict]:
        from scalectl.launch.base import ACTIVE
        from scalectl.launch.registry import refresh

        rows = []
        for r in self.plan.runs:
            info = store.get_run(self.ids[r.name])
            if info["status"] in ACTIVE:
                info = refresh(store, info)
            pts = store.points(info["id"])
            axis = r.recipe.fit.axis
            last = pts[-1] if pts else {}
            rows.append({"variant": r.variant, "name": info["name"], "status": info["status"],
                         "step": last.get("step"), "budget": r.recipe.budget.steps, "axis": axis,
                         "compute": last.get(axis), "pass_rate": last.get("pass_rate"),
                         "A": self._fit_A(info["id"], pts, axis), "error": info.get("error")})
        return rows

    def _fit_A(self, run_id: int, pts: list[dict], axis: str) -> float | None:
        """The ceiling fitted to the points so far (no bootstrap), refitted when points arrive."""
        from scalectl.curve import FitError, fit_sigmoid

        cached = self.fits.get(run_id)
        if cached is not None and cached[0] == len(pts):
            return cached[1]
        A = None
        have = [p for p in pts if p.get(axis) is not None]
        if len(have) >= 4:
            try:
                A = fit_sigmoid([p[axis] for p in have], [p["pass_rate"] for p in have], bootstrap=0,
                                axis=axis).A
            except (FitError, ValueError):
                A = None
        self.fits[run_id] = (len(pts), A)
        return A

    @staticmethod
    def table(rows: list[dict]) -> Table:
        table = Table(title="ablation runs")
        for col in ("variant", "run", "status", "step", "compute", "pass rate", "fitted A"):
            table.add_column(col, justify="right" if col in ("step", "compute", "pass rate", "fitted A") else "left")
        for r in rows:
            step = "-" if r["step"] is None else f"{r['step']}/{r['budget'] or '?'}"
            table.add_row(r["variant"], r["name"], r["status"], step, fmt(r["compute"]),
                          fmt(r["pass_rate"]), fmt(r["A"]))
        return table

    def lines(self, rows: list[dict]) -> list[str]:
        """Rows whose status or step changed since the last call, as log lines."""
        changed = []
        for r in rows:
            key = (r["status"], r["step"])
            if self.seen.get(r["name"]) != key:
                self.seen[r["name"]] = key
                changed.append(f"{r['name']}: {r['status']}, step {fmt(r['step'])}, pass rate "
                               f"{fmt(r['pass_rate'])}, fitted A {fmt(r['A'])}")
        return changed


def _watch(db, plan, ids: dict[str, int], poll_s: float) -> list[dict]:
    """Wait until every run of the plan has ended; return the last rows."""
    from rich.live import Live

    from scalectl.launch.base import ACTIVE

    watch = _Watch(plan, ids)
    live = Live(console=err, auto_refresh=False, transient=False) if err.is_terminal else None
    if live:
        live.start()
    try:
        while True:
            with open_store(db) as store:
                rows = watch.rows(store)
            if live:
                live.update(watch.table(rows), refresh=True)
            else:
                for line in watch.lines(rows):
                    err.print(line, highlight=False)
            if not any(r["status"] in ACTIVE for r in rows):
                return rows
            time.sleep(poll_s)
    finally:
        if live:
            live.stop()


def _cancel_all(db, ids: dict[str, int]) -> int:
    """Cancel every live job of the ablation (each saves a checkpoint); returns how many."""
    from scalectl.launch.base import ACTIVE, last_job, now_iso
    from scalectl.launch.registry import get_launcher, refresh

    n = 0
    with open_store(db) as store:
        for run_id in ids.values():
            info = store.get_run(run_id)
            job = last_job(info.get("run_dir"))
            if info["status"] not in ACTIVE or job is None:
                continue
            err.print(f"cancelling {info['name']} ({job.launcher} job {job.job_id})")
            launcher = get_launcher(job.launcher)
            launcher.cancel(job)
            info = refresh(store, store.get_run(run_id), launcher)
            if info["status"] in ACTIVE:
                store.update_run(run_id, status="cancelled", ended=now_iso(),
                                 error=f"cancelled with its ablation ({job.launcher} job {job.job_id})")
            n += 1
    return n


# --------------------------------------------------------------------------- the end: verdicts and report


def _finish(db, manifest: dict, out_dir: Path, bootstrap: int, margin: float | None, json_: bool,
            extra: dict | None = None) -> None:
    from scalectl.report import gather, write_report

    with open_store(db) as store:
        result = gather(store, manifest, bootstrap=bootstrap, margin=margin)
    paths = write_report(result, out_dir)
    if json_:
        print_json({**(extra or {}), "result": result.to_dict(), "report": {k: str(v) for k, v in paths.items()}})
        return
    table = Table(title=f"{result.name}: variants against {result.baseline} (margin {result.margin:g})")
    for col in ("variant", "A", "B", "C_mid", "dA", "verdict"):
        table.add_column(col, justify="left" if col in ("variant", "verdict") else "right")
    for v in result.variants:
        if v.curve is None:
            table.add_row(v.name, "-", "-", "-", "-", f"not fitted: {v.error}")
            continue
        from scalectl.display import format_estimate

        f = v.curve.fit
        row = result.comparison.row(v.name) if result.comparison else None
        if row is None:
            d, verdict = "-", "-"
        elif row.verdict == "baseline":
            d, verdict = "-", "baseline"
        else:
            lo, hi = row.delta_A_interval
            d, verdict = f"{row.delta_A:+.3f} [{lo:+.3f}, {hi:+.3f}]", row.verdict
        table.add_row(v.name, format_estimate(f.A, f.interval("A")), f"{f.B:.2f}", f"{f.C_mid:.4g}", d, verdict)
    out.print(table)
    for v in result.variants:
        out.print(v.sentence, soft_wrap=True)
    for note in result.notes:
        out.print(f"note: {note}", soft_wrap=True)
    err.print(f"wrote {paths['html']} and {paths['markdown']}")


def _manifest(plan, ids_or_names: dict[str, str], db: str) -> dict:
    data = plan.to_dict()
    for v in data["variants"]:
        v["runs"] = [ids_or_names.get(n, n) for n in v["runs"]]
    data["db"] = str(Path(db).resolve())
    return data


# --------------------------------------------------------------------------- commands


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
    margin: Annotated[float | None, typer.Option(help="Noise margin on A (default: the ablation's, 0.02).")] = None,
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
    from scalectl.ablation import plan as make_plan
    from scalectl.launch.registry import LAUNCHER_TYPES
    from scalectl.store import default_db_path

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
    from scalectl.trackers import check_installed

    check_installed(plan.variants[0].recipe.logging)     # [logging] backends: before any run starts
    kind = launcher or plan.variants[0].recipe.launcher.type
    if kind not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {kind!r} is not one of: {', '.join(LAUNCHER_TYPES)}")
    db = db or default_db_path()
    have_store = db == ":memory:" or Path(db).exists()
    actions: dict = {}
    measured = None
    if have_store:
        with open_store(db) as store:
            actions = _resolve(store, plan)
            measured = measured_rate(store, plan.variants[0].recipe)
    counts: dict[str, int] = {}
    for r in plan.runs:
        a = actions.get(r.name, ("new", None))[0]
        counts[a] = counts.get(a, 0) + 1
    if rate is not None:
        rate_src = (rate, "given with --rate")
    elif measured is not None:
        rate_src = (measured[0], f"measured on {measured[1]} completed run(s) in {db}")
    elif spec.device_hours_per_step is not None:
        rate_src = (spec.device_hours_per_step, "configured in the ablation file")
    else:
        rate_src = None
    cost = _cost(plan, actions, rate_src)
    plan_json = {"plan": plan.to_dict(), "cost": cost, "launcher": kind,
                 "actions": {n: {"action": a, "run": None if row is None else row["name"]}
                             for n, (a, row) in ((r.name, actions.get(r.name, ("new", None))) for r in plan.runs)}}
    if json_ and dry_run:
        print_json(plan_json)
        return
    if not json_:
        _print_plan(plan, actions, cost, counts)
    if dry_run:
        return
    with open_store(db, create=True) as store:
        actions = _resolve(store, plan)      # again: the store may have moved since the plan
        ids = _launch(store, plan, actions, kind, runs_dir)
        names = {n: store.get_run(i)["name"] for n, i in ids.items()}
    manifest = _manifest(plan, names, db)
    _write_manifest(manifest_path(runs_dir, spec.name), manifest)
    try:
        rows = _watch(db, plan, ids, poll)
    except KeyboardInterrupt:
        err.print("interrupted: cancelling the ablation's jobs (each saves a checkpoint)")
        n = _cancel_all(db, ids)
        err.print(f"cancelled {n} run(s); run the same command again to continue where it stopped")
        raise typer.Exit(130) from None
    failed = [r for r in rows if r["status"] != "completed"]
    for r in failed:
        err.print(f"[red]{r['name']}[/red] ended {r['status']}: {(r['error'] or '').splitlines()[0] if r['error'] else ''}",
                  markup=True)
    _finish(db, manifest, out_dir or Path("reports") / spec.name, bootstrap, margin, json_,
            extra={**plan_json, "runs": {r["name"]: r["status"] for r in rows}})


def _manifest_from_store(store, name: str) -> dict:
    """An ablation's manifest rebuilt from run names ``NAME--VARIANT--sSEED``
    (e.g. imported curves): variants in order of their first run; the baseline
    is ``base`` when there is one, else the first variant."""
    from scalectl.ablation import BASE, diff, parse_run_name
    from scalectl.recipe import Recipe

    groups: dict[str, list[dict]] = {}
    for r in store.find_runs(name_prefix=f"{name}--"):
        parsed = parse_run_name(r["name"])
        if parsed and parsed[0] == name:
            groups.setdefault(parsed[1], []).append(r)
    if not groups:
        raise UserError(f"no ablation {name!r}: no manifest and no run named {name}--VARIANT--sSEED in {store.path}")
    baseline = BASE if BASE in groups else next(iter(groups))

    def recipe(runs):
        try:
            return Recipe.model_validate(runs[0]["recipe"]) if runs[0].get("recipe") else None
        except ValueError:
            return None

    base_recipe = recipe(groups[baseline])
    variants = []
    for v, runs in groups.items():
        rec = recipe(runs)
        changes = [] if v == baseline or rec is None or base_recipe is None else \
            [[c.key, c.old, c.new] for c in diff(base_recipe, rec)]
        variants.append({"name": v, "is_base": v == baseline, "lead": "", "changes": changes,
                         "runs": [r["name"] for r in runs]})
    variants.sort(key=lambda v: not v["is_base"])
    return {"name": name, "kind": "unknown", "baseline": baseline, "variants": variants,
            "notes": [f"no manifest: runs found by their names {name}--VARIANT--sSEED"]}


def find_manifest(store, ref: str, runs_dir: str | Path = "runs") -> dict:
    """The manifest of ``ref``: an ablation file or name (see :func:`report`).

    Raises:
        UserError: an invalid file, or a name with neither a manifest nor runs.
    """
    from scalectl.ablation import plan as make_plan
    from scalectl.ablation import read_ablation
    from scalectl.names import check_name
    from scalectl.runs import find_existing

    if not ref.strip():
        raise UserError("ABLATION is empty: give an ablation name or an ablation file (ablations/*.toml)")
    path, runs_dir = Path(ref), Path(runs_dir)
    if path.suffix == ".toml" or path.exists():
        spec = read_ablation(path)
        saved = manifest_path(runs_dir, spec.name)
        if saved.exists():
            return json.loads(saved.read_text())
        plan = make_plan(spec)
        names = {}
        for r in plan.runs:
            try:
                names[r.name] = store.get_run(r.name)["name"]
            except UserError:
                found = find_existing(store, r.recipe_hash, r.seed, refresh=False)
                names[r.name] = found[1]["name"] if found else r.name
        return _manifest(plan, names, store.path)
    check_name(ref, "ablation name")
    saved = manifest_path(runs_dir, ref)
    if saved.exists():
        return json.loads(saved.read_text())
    return _manifest_from_store(store, ref)


@user_errors
def report(
    ablation: Annotated[str, typer.Argument(metavar="ABLATION", help="Ablation name or file (ablations/*.toml).")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="Report folder (default reports/NAME).")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where ablation manifests are (RUNS_DIR/.ablations).")] = Path("runs"),
    margin: Annotated[float | None, typer.Option(help="Noise margin on A (default: the ablation's, 0.02).")] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples per fit (0: none).")] = 1000,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Write an ablation's report: index.html (figures embedded) and summary.md.

    ABLATION is the name given to `scalectl ablate` (its manifest in
    RUNS_DIR/.ablations) or an ablation file; without a manifest the runs are
    found by their names NAME--VARIANT--sSEED (imported curves too).
    """
    with open_store(db) as store:
        manifest = find_manifest(store, ablation, runs_dir)
        path = store.path
    _finish(path, manifest, out_dir or Path("reports") / manifest["name"], bootstrap, margin, json_)


def register(app: typer.Typer) -> None:
    """Add ``ablate`` and ``report`` to the app."""
    app.command()(ablate)
    app.command()(report)
