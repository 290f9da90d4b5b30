"""Running an ablation: its manifest, its cost, reusing stored runs, launching, watching, cancelling.

``scalectl ablate`` is :func:`prepare` (the plan, what becomes of each run, the
cost) then :func:`run` (launch, watch until every run ends, then the verdicts
and the report); a notebook calls the same two.  The runs an ablation uses are
recorded in ``RUNS_DIR/.ablations/NAME.json`` (its manifest: the plan, with the
stored run standing for each planned run); runs it creates are named
``<ablation>--<variant>--s<seed>``.  Stored runs that already train a planned
recipe hash and seed are reused (completed ones as they are, interrupted ones
resumed from their checkpoints, live ones watched): :func:`resolve`.
Everything here returns data, and tells its progress to a :class:`Progress`;
the command prints.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalectl.ablation.planner import BASE, diff, parse_run_name, read_ablation
from scalectl.ablation.planner import plan as make_plan
from scalectl.errors import UserError
from scalectl.names import check_name
from scalectl.recipe.schema import Recipe
from scalectl.science.fits import fit_r0, fit_window, parse_r0
from scalectl.launch.runs import ATTACH, NEW, RESUME, REUSE, cancel, create_run, find_existing, submit, unique_name

MANIFEST_DIR = ".ablations"


# --------------------------------------------------------------------------- the manifest


def manifest_path(runs_dir: str | Path, name: str) -> Path:
    """Where the manifest of ablation ``name`` lives: ``RUNS_DIR/.ablations/NAME.json``."""
    return Path(runs_dir) / MANIFEST_DIR / f"{name}.json"


def write_manifest(path: Path, data: dict) -> None:
    """Write a manifest (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def manifest(plan, names: dict[str, str], db: str) -> dict:
    """The manifest of ``plan``: :meth:`Plan.to_dict` with each planned run name replaced by the
    name of the stored run standing for it (``names``), and the store's path."""
    data = plan.to_dict()
    for v in data["variants"]:
        v["runs"] = [names.get(n, n) for n in v["runs"]]
    data["db"] = str(Path(db).resolve())
    return data


def manifest_from_store(store, name: str) -> dict:
    """An ablation's manifest rebuilt from run names ``NAME--VARIANT--sSEED``
    (e.g. imported curves): variants in order of their first run; the baseline
    is ``base`` when there is one, else the first variant.

    Raises:
        UserError: no run of that ablation in the store.
    """
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
                         "runs": [r["name"] for r in runs], "recipe_hash": runs[0].get("recipe_hash")})
    variants.sort(key=lambda v: not v["is_base"])
    return {"name": name, "kind": "unknown", "baseline": baseline, "variants": variants,
            "notes": [f"no manifest: runs found by their names {name}--VARIANT--sSEED"]}


def find_manifest(store, ref: str, runs_dir: str | Path = "runs") -> dict:
    """The manifest of ``ref``: an ablation file, or the name given to ``scalectl ablate``
    (its saved manifest, else its runs found by name, :func:`manifest_from_store`).

    Raises:
        UserError: an invalid file, or a name with neither a manifest nor runs.
    """
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
        return manifest(plan, names, store.path)
    check_name(ref, "ablation name")
    saved = manifest_path(runs_dir, ref)
    if saved.exists():
        return json.loads(saved.read_text())
    return manifest_from_store(store, ref)


# --------------------------------------------------------------------------- reuse and cost


def resolve(store, plan) -> dict:
    """Planned run name -> (action, stored run or None); the stored run carries ``last_step``.

    Actions: :data:`~scalectl.launch.runs.NEW`, :data:`~scalectl.launch.runs.REUSE`,
    :data:`~scalectl.launch.runs.ATTACH`, :data:`~scalectl.launch.runs.RESUME` (:func:`scalectl.launch.runs.find_existing`).
    """
    actions = {}
    for r in plan.runs:
        found = find_existing(store, r.recipe_hash, r.seed, prefer=r.name)
        if found is None:
            actions[r.name] = (NEW, None)
            continue
        pts = store.points(found[1]["id"])
        actions[r.name] = (found[0], dict(found[1], last_step=pts[-1]["step"] if pts else None))
    return actions


def action_counts(plan, actions: dict) -> dict[str, int]:
    """How many planned runs get each action."""
    counts: dict[str, int] = {}
    for r in plan.runs:
        a = actions.get(r.name, (NEW, None))[0]
        counts[a] = counts.get(a, 0) + 1
    return counts


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


def cost_rate(given: float | None, measured: tuple[float, int] | None, configured: float | None,
              db: str) -> tuple[float, str] | None:
    """The device-hours per step of the cost estimate and where it comes from: given on the
    command line, else measured in the store, else configured in the ablation file, else None."""
    if given is not None:
        return given, "given with --rate"
    if measured is not None:
        return measured[0], f"measured on {measured[1]} completed run(s) in {db}"
    if configured is not None:
        return configured, "configured in the ablation file"
    return None


def cost(plan, actions: dict, rate: tuple[float, str] | None) -> dict:
    """Steps and device-hours still to train: full budget for new runs, the
    remainder for resumed ones, nothing for reused or attached ones.

    Returns:
        steps, runs_without_step_budget, device_hours (None without a rate), rate, rate_source.
    """
    steps, unknown, gpu_budget = 0, 0, 0.0
    for r in plan.runs:
        action, row = actions.get(r.name, (NEW, None))
        if action in (REUSE, ATTACH):
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


# --------------------------------------------------------------------------- launching, watching, cancelling


def launch(store, plan, actions: dict, kind: str, runs_dir: Path) -> tuple[dict[str, int], int]:
    """Create the new runs, then submit new and resumed ones together
    (:func:`scalectl.launch.runs.submit`: one Slurm job array, named after the ablation).

    Returns:
        (planned name -> run id, number of runs submitted).
    """
    from scalectl.job.body import read_job_file
    from scalectl.launch.base import RunSpec

    ids, specs = {}, []
    for r in plan.runs:
        action, row = actions[r.name]
        if action == NEW:
            name = unique_name(store, r.name, runs_dir)
            run_id, run_dir = create_run(store, r.recipe, name, runs_dir, launcher=kind)
            ids[r.name] = run_id
            specs.append(RunSpec(run_id, name, run_dir, r.recipe))
        else:
            ids[r.name] = row["id"]
            if action == RESUME:
                recipe = Recipe.model_validate(read_job_file(Path(row["run_dir"]))["recipe"])
                specs.append(RunSpec(row["id"], row["name"], Path(row["run_dir"]), recipe))
    if specs:
        submit(store, specs, kind, array=True, job_name=plan.spec.name)
    return ids, len(specs)


@dataclass
class Watch:
    """The state of an ablation's runs, looked up again at each :meth:`rows`; the ceiling
    fitted to each run's points so far (no bootstrap, the fit window of
    :func:`scalectl.science.fits.fit_window`), refitted only when points arrive."""

    plan: object
    ids: dict[str, int]
    fits: dict[int, tuple[int, float | None]] = field(default_factory=dict)

    def rows(self, store) -> list[dict]:
        """One row per planned run: variant, name, status, step, budget, axis, compute,
        pass_rate, A (fitted so far), error."""
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
                         "A": self._fit_A(info, pts, axis), "error": info.get("error")})
        return rows

    def _fit_A(self, run: dict, pts: list[dict], axis: str) -> float | None:
        from scalectl.curve import FitError, fit_sigmoid

        cached = self.fits.get(run["id"])
        if cached is not None and cached[0] == len(pts):
            return cached[1]
        A = None
        have = [p for p in pts if p.get(axis) is not None]
        if len(have) >= 4:
            x = [p[axis] for p in have]
            section = (run.get("recipe") or {}).get("fit") or {}
            try:
                A = fit_sigmoid(x, [p["pass_rate"] for p in have], min_compute=fit_window(section, axis, x),
                                r0=parse_r0(fit_r0(section)), bootstrap=0, axis=axis).A
            except (FitError, ValueError):
                A = None
        self.fits[run["id"]] = (len(pts), A)
        return A


def cancel_all(store, ids: dict[str, int], log=lambda message: None) -> int:
    """Cancel every live job of an ablation (each saves a checkpoint); returns how many."""
    from scalectl.launch.base import ACTIVE, last_job

    n = 0
    for run_id in ids.values():
        info = store.get_run(run_id)
        job = last_job(info.get("run_dir"))
        if info["status"] not in ACTIVE or job is None:
            continue
        log(f"cancelling {info['name']} ({job.launcher} job {job.job_id})")
        cancel(store, run_id, reason="cancelled with its ablation")
        n += 1
    return n


# --------------------------------------------------------------------------- the campaign


class Progress:
    """What :func:`run` tells as it goes; this one tells nothing (the command's prints it)."""

    def log(self, message: str) -> None:
        """A line of progress: the runs launched, the jobs cancelled after Ctrl-C."""

    def runs(self, rows: list[dict]) -> None:
        """Each look at the runs while they train (:meth:`Watch.rows`)."""

    def watched(self, rows: list[dict] | None) -> None:
        """The watch is over: the last look once every run has ended, or None (interrupted)."""


@dataclass(frozen=True)
class Prepared:
    """An ablation planned against the store, before anything is launched.

    plan: the :class:`scalectl.ablation.planner.Plan`; kind: the launcher; db: the store's
    path; actions: planned run name -> (action, stored run or None) (:func:`resolve`, empty
    when there is no store yet); cost: :func:`cost`.
    """

    plan: Any
    kind: str
    db: str
    actions: dict
    cost: dict

    def counts(self) -> dict[str, int]:
        """How many planned runs get each action (:func:`action_counts`)."""
        return action_counts(self.plan, self.actions)

    def to_dict(self) -> dict:
        """JSON-ready: plan, cost, launcher and, per planned run, its action and stored run."""
        return {"plan": self.plan.to_dict(), "cost": self.cost, "launcher": self.kind,
                "actions": {n: {"action": a, "run": None if row is None else row["name"]}
                            for n, (a, row) in ((r.name, self.actions.get(r.name, (NEW, None)))
                                                for r in self.plan.runs)}}


@dataclass(frozen=True)
class Outcome:
    """The end of :func:`run`: the last look at the runs, the manifest, and the verdicts
    (:class:`scalectl.ablation.analysis.AblationResult`) with the report's files; or, after
    Ctrl-C (``interrupted``), how many jobs were cancelled and no result."""

    prepared: Prepared
    rows: list[dict]
    manifest: dict
    result: Any = None
    report: dict[str, Path] | None = None
    interrupted: bool = False
    cancelled: int = 0

    def to_dict(self) -> dict:
        """JSON-ready: :meth:`Prepared.to_dict`, each run's status, the result and the report's paths."""
        return {**self.prepared.to_dict(), "runs": {r["name"]: r["status"] for r in self.rows},
                "result": None if self.result is None else self.result.to_dict(),
                "report": {k: str(v) for k, v in (self.report or {}).items()}}


def prepare(spec, *, db: str, setup=None, overrides=(), repeats: int | None = None, launcher: str | None = None,
            rate: float | None = None) -> Prepared:
    """Plan ablation ``spec`` (an :class:`scalectl.ablation.planner.AblationSpec`) against the
    store at ``db``: the runs (:func:`scalectl.ablation.planner.plan`), what becomes of each
    and the cost (``rate``: device-hours per step, else measured in the store, else the
    ablation file's).  Reads the store if there is one; creates nothing.

    Raises:
        UserError: a plan that does not load, a tracker library missing, an unknown launcher.
    """
    from scalectl.job.trackers import check_installed
    from scalectl.launch.registry import LAUNCHER_TYPES
    from scalectl.store.journal import open_with_journals

    plan = make_plan(spec, setup=setup, overrides=overrides, repeats=repeats)
    check_installed(plan.variants[0].recipe.logging)     # [logging] backends: before any run starts
    kind = launcher or plan.variants[0].recipe.launcher.type
    if kind not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {kind!r} is not one of: {', '.join(LAUNCHER_TYPES)}")
    actions, measured = {}, None
    if db == ":memory:" or Path(db).exists():
        with open_with_journals(db) as store:
            actions = resolve(store, plan)
            measured = measured_rate(store, plan.variants[0].recipe)
    rated = cost_rate(rate, measured, spec.device_hours_per_step, db)
    return Prepared(plan, kind, db, actions, cost(plan, actions, rated))


def run(prepared: Prepared, *, runs_dir: str | Path = "runs", out_dir: str | Path | None = None,
        bootstrap: int = 1000, margin: float | None = None, poll: float = 2.0,
        progress: Progress | None = None) -> Outcome:
    """Launch the ablation's runs, watch them until every one has ended, then fit every
    variant and write the report (:func:`scalectl.ablation.report.build_report`, into
    ``out_dir``, default ``reports/NAME``).

    The store is created if missing; the resolution of stored runs is done again (the store
    may have moved since :func:`prepare`), and the manifest written before the watch.  Ctrl-C
    (KeyboardInterrupt) while watching cancels the ablation's jobs (each saves a checkpoint)
    and returns with ``interrupted``: the same call again continues where it stopped.

    Args:
        poll: seconds between two looks at the runs.
        bootstrap, margin: of the fits and verdicts (margin default: the ablation's).
    """
    from scalectl.ablation.report import build_report
    from scalectl.present.watch import follow
    from scalectl.store.journal import open_with_journals

    progress = progress or Progress()
    plan, db = prepared.plan, prepared.db
    with open_with_journals(db, create=True) as store:
        actions = resolve(store, plan)      # again: the store may have moved since the plan
        ids, launched = launch(store, plan, actions, prepared.kind, runs_dir)
        names = {n: store.get_run(i)["name"] for n, i in ids.items()}
    if launched:
        progress.log(f"launched {launched} run(s) on {prepared.kind}"
                     + (f" (at most {plan.runs[0].recipe.launcher.max_parallel} at once)"
                        if prepared.kind == "local" else ""))
    data = manifest(plan, names, db)
    write_manifest(manifest_path(runs_dir, plan.spec.name), data)
    watch = Watch(plan, ids)

    def look() -> list[dict]:
        with open_with_journals(db) as store:
            return watch.rows(store)

    try:
        rows = follow(look, progress.runs, poll)
    except KeyboardInterrupt:
        progress.watched(None)
        progress.log("interrupted: cancelling the ablation's jobs (each saves a checkpoint)")
        with open_with_journals(db) as store:
            n = cancel_all(store, ids, log=progress.log)
        return Outcome(prepared, [], data, interrupted=True, cancelled=n)
    progress.watched(rows)
    result, paths = build_report(db, data, Path(out_dir or Path("reports") / plan.spec.name),
                                 bootstrap=bootstrap, margin=margin)
    return Outcome(prepared, rows, data, result, paths)
