"""Creating, starting and resuming runs, and finding a stored run that already trains a given recipe.

A run is a row in the store plus a run folder holding ``job.json`` (the store
path, the run id and the normalised recipe): everything a launcher needs to
train it, here or on a Slurm node.  ``scalectl run`` is :func:`start` (a new
run: load and check the recipe, create the run, submit it or train it here),
:func:`resume` (continue a stopped run, or extend a completed one with a raised
budget) and :func:`dry_run`; ``scalectl ablate`` creates runs through
:func:`create_run`, hands them to a launcher with :func:`submit`, and stops them
with :func:`cancel`.

The store is never imported here: functions take an open store, or ``stores``, a
callable that opens it (``stores(create=False)`` returns the store as a context
manager, e.g. ``functools.partial(Store.open, "scalectl.db")``), called each time
the store is needed so that no connection stays open while a run trains.

Two runs with the same recipe content hash and seed train the same thing
(:attr:`scalectl.recipe.schema.Recipe.content_hash` leaves out the name, seed,
launcher and checkpoint frequency), so every path that trains a run reuses such a
run instead of training it again: :func:`find_existing` picks the best one.  The
budget only says when training stops (the loop stops at ``budget.steps`` or
``budget.gpu_hours``; nothing else reads it), so a run of the same recipe at a smaller
budget is the start of the longer run: :func:`same_training` finds such runs (whatever
their budget, by :func:`training_key`), and the paths that extend runs (``scalectl run``,
``ablate --until-decided``) extend them instead of training from step 0.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

from scalectl.errors import UserError
from scalectl.names import check_name
from scalectl.recipe.schema import training_key  # noqa: F401  (the key of one training, used here and by callers)

#: What to do with a planned run, given the store (:data:`EXTEND`: resume a run of the same
#: recipe and seed trained to a smaller budget, with the larger one).
REUSE, ATTACH, RESUME, EXTEND, NEW = "reuse", "attach", "resume", "extend", "new"
#: What became of a run that :func:`start` or :func:`resume` handed on (:data:`REUSED`: a stored
#: run of the same recipe and seed had completed, nothing was trained; :data:`ATTACHED`: one is
#: being trained by a live job, nothing was started).
SUBMITTED, COMPLETED, STOPPED, FAILED = "submitted", "completed", "stopped", "failed"
REUSED, ATTACHED = "reused", "attached"

#: Opens the store: ``stores(create=False)`` is a context manager holding it.
Stores = Callable[..., ContextManager[Any]]


def unique_name(store, base: str, runs_dir: str | Path | None = None) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first name not in the store and, given
    ``runs_dir``, whose folder there holds no run (:func:`folder_run`; another store's run
    of the same name may have it)."""
    taken = {r["name"] for r in store.find_runs(name_prefix=base)}

    def free(name: str) -> bool:
        return name not in taken and (runs_dir is None or folder_run(Path(runs_dir) / name) is None)

    if free(base):
        return base
    i = 2
    while not free(f"{base}-{i}"):
        i += 1
    return f"{base}-{i}"


def folder_run(run_dir: str | Path) -> dict | None:
    """What holds the run folder ``run_dir``: ``{"db", "run_id"}`` of its ``job.json``
    (``{}`` for an unreadable one), or None for a folder that holds no run (missing,
    or without ``job.json``)."""
    from scalectl.job.body import JOB_FILE, read_job_file

    if not (Path(run_dir) / JOB_FILE).exists():
        return None
    try:
        job = read_job_file(run_dir)
    except (OSError, ValueError):
        return {}
    return {"db": job.get("db"), "run_id": job.get("run_id")}


def create_run(store, recipe, name: str, runs_dir: str | Path, launcher: str = "local") -> tuple[int, Path]:
    """Insert run ``name`` for ``recipe`` (a :class:`scalectl.recipe.schema.Recipe`) and
    write its folder ``RUNS_DIR/NAME/job.json``.

    Returns:
        (run id, absolute run folder).

    Raises:
        UserError: an unsafe name (:func:`scalectl.names.check_name`), a run
            of that name already in the store, a run folder that holds a run
            already (another store's, whose checkpoints the new run would
            resume from and whose ``job.json`` it would overwrite), or a run
            folder that cannot be written (the row is not kept).
    """
    from scalectl.job.body import write_job_file

    check_name(name)
    run_dir = (Path(runs_dir) / name).resolve()
    held = folder_run(run_dir)
    if held is not None:
        owner = (f" (run id {held['run_id']} of the store {held['db']})"
                 if held.get("db") else "")
        raise UserError(f"run {name}: the run folder {run_dir} holds another run{owner}; nothing "
                        "was stored: give another --name or --runs-dir, or resume that run "
                        "through its store")
    with store.transaction():     # a folder that cannot be written leaves no row behind
        run_id = store.create_run(name, recipe=recipe.to_dict(), recipe_hash=recipe.content_hash,
                                  seed=recipe.seed, launcher=launcher, hardware=recipe.hardware.name,
                                  run_dir=str(run_dir))
        try:
            write_job_file(run_dir, db=store.path, run_id=run_id, recipe=recipe.to_dict())
        except OSError as exc:
            raise UserError(f"run {name}: cannot write the run folder {run_dir} "
                            f"({exc.strerror or exc}); nothing was stored") from None
    return run_id, run_dir


@dataclass(frozen=True)
class Removed:
    """What :func:`remove_run` removed: the run's row (as it was), rows by table, and its folder
    (None when it kept it: no folder, or one that holds another store's run)."""

    run: dict
    rows: dict
    folder: Path | None


def removal(store, ref) -> tuple[dict, Path | None]:
    """The run :func:`remove_run` would remove and the folder it would delete with it (None: none,
    or a folder that holds another store's run, which is kept).

    Raises:
        UserError: no such run, or a run whose job is alive (pending or running: cancel it first).
    """
    from scalectl.launch.base import ACTIVE
    from scalectl.launch.registry import refresh

    info = store.get_run(ref)
    if info["status"] in ACTIVE and info.get("source") != "import":
        info = refresh(store, info)
    if info["status"] in ACTIVE - {"created"}:
        raise UserError(f"run {info['name']} is {info['status']}; cancel it first (scalectl cancel {info['name']})")
    folder = Path(info["run_dir"]) if info.get("run_dir") else None
    if folder is not None:
        held = folder_run(folder)
        mine = held is not None and held.get("run_id") == info["id"] and \
            Path(str(held.get("db"))).resolve() == Path(store.path).resolve()
        if not mine and (held is not None or not folder.exists()):
            folder = None                       # another store's run, or nothing there
    return info, folder


def remove_run(store, ref) -> Removed:
    """Remove a run: its row, its points, series, fits and journal offsets, and its run folder
    (checkpoints, logs) when the folder is this run's.  The folder is moved aside first and
    deleted once the rows are gone, so a failure leaves both as they were.

    Raises:
        UserError: as :func:`removal`; a read-only store (nothing removed).
    """
    import os
    import shutil

    info, folder = removal(store, ref)
    if store.readonly:
        raise UserError(f"{store.path}: the store is read-only (its file or folder cannot be written); nothing removed")
    aside = None
    if folder is not None:
        aside = folder.with_name(f".removed-{folder.name}-{os.getpid()}")
        os.replace(folder, aside)
    try:
        rows = store.delete_run(info["id"])
    except BaseException:
        if aside is not None:
            os.replace(aside, folder)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return Removed(info, rows, folder)


def failed_at_start(store, run: dict) -> bool:
    """Whether a run failed before it trained anything: status ``failed``, no evaluation point,
    no checkpoint in its folder (its name is then free for the next run: :func:`start`).  Checkpoint
    folders are found by name (``checkpoints/step-*/state.pt``, :mod:`scalectl.rl.checkpoint`),
    without importing torch."""
    if run["status"] != "failed" or run.get("source") == "import" or store.points(run["id"]):
        return False
    return not run.get("run_dir") or not any((Path(run["run_dir"]) / "checkpoints").glob("*step-*/state.pt"))


def _free_failed_name(store, name: str, log: Callable[[str], None]) -> None:
    """Remove the run ``name`` when it failed at start (:func:`failed_at_start`), saying so."""
    found = [r for r in store.find_runs(name_prefix=name) if r["name"] == name]
    if found and failed_at_start(store, found[0]):
        error = (found[0].get("error") or "").strip().splitlines()
        remove_run(store, found[0]["id"])
        log(f"note: run {name} failed at start ({error[-1] if error else 'no error recorded'}); "
            "it is removed and its name taken again")


def submit(store, runs: list, kind: str, *, array: bool = False, job_name: str | None = None) -> list:
    """Hand runs already in the store to the launcher named ``kind`` and record their jobs.

    Each run is marked ``pending`` first (the job body marks it ``running`` itself).

    Args:
        runs: :class:`scalectl.launch.base.RunSpec` of each run.
        array: submit them together (:meth:`~scalectl.launch.base.Launcher.submit_many`:
            one Slurm job array); else one by one.
        job_name: the name of that job array (an ablation's name); None: the launcher's default.

    Returns:
        The :class:`~scalectl.launch.base.JobHandle` of each run, in order.

    Raises:
        UserError: an unknown launcher, or a refused submission (the runs are then
            marked failed with the reason).
    """
    from scalectl.launch.registry import get_launcher

    launcher = get_launcher(kind)
    for r in runs:
        store.update_run(r.run_id, status="pending", launcher=kind, error=None, ended=None)
    try:
        jobs = launcher.submit_many(runs, job_name=job_name) if array else [launcher.submit(r) for r in runs]
    except BaseException as exc:
        for r in runs:
            store.update_run(r.run_id, status="failed", error=f"submission failed: {exc}")
        raise
    for r, job in zip(runs, jobs):
        store.add_job_id(r.run_id, job.job_id)
    return jobs


def cancel(store, ref, *, reason: str = "cancelled by scalectl cancel", log=lambda message: None):
    """Stop a run's job (local: SIGINT, then SIGKILL; Slurm: scancel); the job saves a checkpoint.

    A run whose job never started is marked cancelled at once; one whose job ends
    without recording it is marked cancelled here, with ``reason``.

    Returns:
        (the run's row afterwards, its last job or None, whether it was alive).

    Raises:
        UserError: no such run.
    """
    from scalectl.launch.base import ACTIVE, last_job, now_iso
    from scalectl.launch.registry import get_launcher, refresh

    info = store.get_run(ref)
    job = last_job(info.get("run_dir"))
    if info["status"] not in ACTIVE:
        return info, job, False
    if job is None:
        store.update_run(info["id"], status="cancelled", ended=now_iso(), error="cancelled before it started")
        return store.get_run(info["id"]), None, True
    launcher = get_launcher(job.launcher)
    log(f"cancelling {job.launcher} job {job.job_id} of run {info['name']}")
    launcher.cancel(job)
    info = refresh(store, store.get_run(info["id"]), launcher)
    if info["status"] in ACTIVE:
        store.update_run(info["id"], status="cancelled", ended=now_iso(),
                         error=f"{reason} ({job.launcher} job {job.job_id})")
    return store.get_run(info["id"]), job, True


def start_here(store, run_id: int, run_dir: Path, kind: str) -> None:
    """Record the calling process as the job of a run it trains in the foreground (so that
    ``scalectl status`` notices if it dies).

    Raises:
        UserError: the launcher ``kind`` cannot train in this process (e.g. slurm).
    """
    from scalectl.launch.registry import get_launcher

    launcher = get_launcher(kind)
    if not launcher.runs_here:
        raise UserError(f"the {kind} launcher cannot train a run in this process: submit it instead")
    job = launcher.foreground_job(run_dir)
    store.update_run(run_id, launcher=kind)
    store.add_job_id(run_id, job.job_id)


def resumable(store, ref) -> tuple[dict, object]:
    """A stored run that can be continued, and its recipe (from its ``job.json``).

    Raises:
        UserError: no such run, no run folder, or a job still alive (cancel it first).
    """
    from scalectl.job.body import read_job_file
    from scalectl.launch.base import ACTIVE
    from scalectl.launch.registry import refresh
    from scalectl.recipe.schema import Recipe

    info = store.get_run(ref)
    if not has_job_file(info):
        raise UserError(f"run {ref!r} has no run folder to resume from")
    info = refresh(store, info)
    if info["status"] in ACTIVE - {"created"}:
        raise UserError(f"run {info['name']} is {info['status']} (job {info.get('job_id')}); "
                        f"cancel it first (scalectl cancel {info['name']})")
    return info, Recipe.model_validate(read_job_file(Path(info["run_dir"]))["recipe"])


def has_job_file(run: dict) -> bool:
    """Whether the run has a folder with ``job.json`` (so it can be launched or resumed)."""
    from scalectl.job.body import JOB_FILE

    return bool(run.get("run_dir")) and (Path(run["run_dir"]) / JOB_FILE).exists()


def find_existing(store, recipe_hash: str, seed: int, prefer: str | None = None,
                  refresh: bool = True) -> tuple[str, dict] | None:
    """The stored run that best stands for (recipe_hash, seed), and what to do with it.

    In order: a ``completed`` run (:data:`REUSE`); a run whose job is alive,
    ``created``/``pending``/``running`` (:data:`ATTACH`: watch it, start nothing);
    a run that stopped early, ``cancelled``/``failed``/``timed_out``, or was
    created but never launched, with its run folder (:data:`RESUME`: continue
    from its latest checkpoint).  Within a class the run named ``prefer``
    comes first, then the most recent.

    Args:
        refresh: ask the launcher about runs the store calls alive
            (:func:`scalectl.launch.base.refresh`), so a job that died
            silently counts as stopped.

    Returns:
        (action, run row), or None when no run stands for it.
    """
    from scalectl.launch.base import ACTIVE, last_job
    from scalectl.launch.registry import refresh as refresh_run

    runs = [r for r in store.find_runs(recipe_hash=recipe_hash) if r.get("seed") == seed]
    classes: dict[str, list[dict]] = {REUSE: [], ATTACH: [], RESUME: []}
    for r in runs:
        if refresh and r["status"] in ACTIVE and r.get("source") != "import":
            r = refresh_run(store, r)
        if r["status"] == "completed":
            classes[REUSE].append(r)
        elif not has_job_file(r):
            continue
        elif r["status"] in ACTIVE and last_job(r["run_dir"]) is not None:
            classes[ATTACH].append(r)
        else:
            classes[RESUME].append(r)
    for action in (REUSE, ATTACH, RESUME):
        found = sorted(classes[action], key=lambda r: (r["name"] == prefer, r["id"]), reverse=True)
        if found:
            return action, found[0]
    return None


def trained_steps(store, run: dict) -> int:
    """The last evaluated step of a stored run (0 without points)."""
    pts = store.points(run["id"])
    return int(pts[-1]["step"]) if pts else 0


def same_training(store, recipe, seed: int | None = None, refresh: bool = True) -> list[tuple[dict, int]]:
    """The stored runs that train what ``recipe`` trains at ``seed`` (default the recipe's), whatever
    their budget and name (:func:`training_key`), each with the steps it has trained: most steps
    first, then the oldest.

    Runs that can stand for it only: completed ones, and ones with a run folder (a live job, or one
    that stopped: they can be watched, resumed or extended).  An imported run without a run folder
    counts only when completed.  ``refresh``: ask the launcher about runs the store calls alive
    (:func:`scalectl.launch.registry.refresh`), so that a job that died silently counts as stopped.
    """
    from scalectl.launch.base import ACTIVE
    from scalectl.launch.registry import refresh as refresh_run

    seed = recipe.seed if seed is None else seed
    key = training_key(recipe)
    found = []
    for r in store.list_runs():
        if r.get("seed") != seed or not r.get("recipe"):
            continue
        if r.get("recipe_hash") != recipe.content_hash and training_key(r["recipe"]) != key:
            continue
        if refresh and r["status"] in ACTIVE and r.get("source") != "import":
            r = refresh_run(store, r)
        if r["status"] == "completed" or has_job_file(r):
            found.append((r, trained_steps(store, r)))
    return sorted(found, key=lambda x: (-x[1], x[0]["id"]))


def _extendable(run: dict, steps: int, recipe) -> bool:
    """Whether the stored ``run`` (with ``steps`` trained) can be extended to ``recipe``'s budget by
    raising its ``budget.steps`` alone: a run folder, no live job, fewer steps than the budget, and
    the same GPU-hour limit."""
    from scalectl.launch.base import ACTIVE

    budget = (run.get("recipe") or {}).get("budget") or {}
    return (has_job_file(run) and run["status"] not in ACTIVE - {"created"} and recipe.budget.steps is not None
            and steps < recipe.budget.steps and budget.get("gpu_hours") == recipe.budget.gpu_hours)


def stored_run_for(store, recipe, prefer: str | None = None) -> tuple[str, dict, int] | None:
    """What a stored run of ``recipe``'s content and seed (any name) means for training it again:
    (action, run row, steps it has trained), or None when nothing stands for it.

    :func:`find_existing` on the recipe's hash first: :data:`REUSE` (completed),
    :data:`ATTACH` (a live job trains it) or :data:`RESUME` (stopped: continue it).  Else a run of
    the same recipe and seed trained to a smaller budget (:func:`same_training`) that can take the
    larger one by raising ``budget.steps``: :data:`EXTEND`.
    """
    found = find_existing(store, recipe.content_hash, recipe.seed, prefer=prefer)
    if found is not None:
        return found[0], found[1], trained_steps(store, found[1])
    for row, steps in same_training(store, recipe):
        if _extendable(row, steps, recipe):
            return EXTEND, row, steps
    return None


# --------------------------------------------------------------------------- scalectl run


def _quiet(message: str) -> None:
    pass


@dataclass(frozen=True)
class Started:
    """What :func:`start` or :func:`resume` did with a run.

    Attributes:
        run_id, name, run_dir: the run's row and its (absolute) folder.
        launcher: where it went (``local``, ``slurm``).
        recipe: its :class:`scalectl.recipe.schema.Recipe` (a resumed run's with its raised budget).
        outcome: :data:`SUBMITTED` (a background or Slurm job: ``job``), :data:`COMPLETED`
            (trained in this process: ``summary``, the training summary of
            :func:`scalectl.job.body.run_job`), :data:`STOPPED` (Ctrl-C while training here: the
            run is checkpointed and marked cancelled) or :data:`FAILED` (marked failed:
            ``error``, the traceback in ``error_log``).
    """

    run_id: int
    name: str
    run_dir: Path
    launcher: str
    recipe: Any
    outcome: str
    job: Any = None
    summary: dict | None = None
    error: str | None = None
    error_log: Path | None = None


@dataclass(frozen=True)
class Planned:
    """What :func:`dry_run` found: the run that :func:`start` would create, its layout
    (:func:`scalectl.job.layout.check_layout`), its booking (:mod:`scalectl.job.booking`),
    the warnings of the dry run and what its launcher would submit
    (:class:`scalectl.launch.base.DryRun`)."""

    recipe: Any
    launcher: str
    name: str
    run_dir: Path
    layout: Any
    described: Any
    booking: Any = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready: recipe, hash, launcher, run name and folder, layout (lines, memory,
        weight sync), the booking (:class:`scalectl.job.booking.Booking`), the warnings and
        the launcher's own data (Slurm: parameters and sbatch script)."""
        layout = self.layout
        data: dict = {"recipe": self.recipe.to_dict(), "hash": self.recipe.content_hash, "launcher": self.launcher,
                      "run_name": self.name, "run_dir": str(self.run_dir),
                      "layout": {"lines": layout.lines,
                                 "memory": asdict(layout.memory) | {"total": layout.memory.total}
                                 if layout.memory else None,
                                 "weight_sync": asdict(layout.weight_sync) if layout.weight_sync else None},
                      "booking": self.booking.to_dict() if self.booking is not None else None,
                      "warnings": list(self.warnings)}
        return data | self.described.data


def check_launcher(kind: str | None) -> None:
    """Refuse a launcher name (``--launcher``) that is not registered; None passes.

    Raises:
        UserError: naming the launchers there are.
    """
    from scalectl.launch.registry import LAUNCHER_TYPES

    if kind is not None and kind not in LAUNCHER_TYPES:
        raise UserError(f"--launcher {kind!r} is not one of: {', '.join(LAUNCHER_TYPES)}")


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
        f"  async {r.async_.mode} k={r.async_.k}{' (fixed lag)' if r.async_.schedule == 'fixed_lag' else ''}; "
        f"filters: zero_variance={r.filter.zero_variance} "
        f"dynamic_sampling={r.filter.dynamic_sampling} retire_solved={r.filter.retire_solved}"
        f"@{r.filter.retire_threshold}; length control {r.length.control}",
        f"  batch {r.batch.prompts_per_step} prompts x {r.batch.generations_per_prompt} generations, "
        f"max_new_tokens {r.length.max_new_tokens}, lr {r.optim.lr} (warm-up {r.optim.warmup_steps})",
        f"  model {r.model.path} ({r.model.dtype}), data {r.data.source}, eval every {r.eval.every_steps} "
        f"steps on {r.eval.prompts} prompts x {r.eval.samples_per_prompt}",
        f"  hardware {r.hardware.name}: {r.hardware.generators} generator(s) + {r.hardware.trainers} "
        f"trainer(s), launcher {launcher or r.launcher.type}, budget {budget_text(r.budget)}",
    ]


def _check_layout(recipe, kind: str, describe: bool, log: Callable[[str], None]):
    """Refuse a layout the job would refuse at start (:mod:`scalectl.job.layout`); with
    ``describe``, log the role map, the memory estimate and the weight-sync plan.

    Raises:
        UserError: every problem found, one per line.
    """
    from scalectl.job.layout import check_layout, parameter_count

    needs_params = describe or recipe.hardware.memory_gb is not None
    layout = check_layout(recipe, parameter_count(recipe.model) if needs_params else None, kind)
    if describe:
        for line in layout.lines:
            log(line)
    if layout.problems:
        raise UserError("the run cannot start as set up:\n  " + "\n  ".join(layout.problems))
    return layout


def _prepare(recipe_file, setup, overrides: Sequence[str], launcher: str | None, describe: bool,
             log: Callable[[str], None]):
    """Load the recipe (with its setup and ``--set`` overrides), check what its model and data
    name (:func:`scalectl.recipe.load.check_sources`, :func:`scalectl.job.preflight.check_inputs`:
    the tokenizer, the first rows of the prompt set, keys without effect), its trackers'
    libraries and its layout, and log its plan: (recipe, launcher name, layout).  Each value that
    replaced another layer's explicit one is logged as ``override: ...``
    (:mod:`scalectl.recipe.layers`), each companion a change of loss type reset as ``taken: ...``."""
    from scalectl.job.preflight import check_inputs
    from scalectl.job.trackers import check_installed
    from scalectl.recipe.load import find_default_setup, load

    check_launcher(launcher)
    setup_path = setup or find_default_setup(recipe_file)
    origins: dict[str, str] = {}
    notes: list[str] = []
    overridden: list = []
    recipe = load(recipe_file, setup_path, list(overrides), notes=notes, overridden=overridden, origins=origins)
    for line in [*(f"override: {o}" for o in overridden), *(f"taken: {n}" for n in notes)]:
        log(line)
    check_installed(recipe.logging)
    kind = launcher or recipe.launcher.type
    for line in plan_lines(recipe, setup_path, kind):
        log(line)
    inputs = check_inputs(recipe, origins)
    inputs.problems[:0] = _source_problems(recipe, origins, str(recipe_file), kind, describe, log)
    for line in inputs.lines if describe else ():
        log(line)
    for warning in inputs.warnings:
        log(f"warning: {warning}")
    inputs.raise_problems()
    return recipe, kind, _check_layout(recipe, kind, describe, log)


def _source_problems(recipe, origins: dict[str, str], label: str, kind: str, describe: bool,
                     log: Callable[[str], None]) -> list[str]:
    """What :func:`scalectl.recipe.load.check_sources` finds wrong with ``model.path`` and
    ``data.source``, each led by the file (or ``--set``) that set the key.  A path that is not
    on this machine is only warned about in a dry run or for a launcher that runs elsewhere
    (Slurm: the job looks for it where it runs); anything else is a problem.  The dry run
    (``describe``) warns about it once, among its booking (:func:`_booking`), not here."""
    from scalectl.recipe.load import check_sources

    problems = []
    for key, message in check_sources(recipe):
        where = origins.get(key, label)
        if "no such " in message and (describe or kind != "local"):
            if not describe:
                log(f"warning: {where}: {message} here (the job looks for it where it runs)")
        else:
            problems.append(f"{where}: {message}")
    return problems


def dry_run(recipe_file, *, setup=None, overrides: Sequence[str] = (), name: str | None = None,
            runs_dir: str | Path = "runs", launcher: str | None = None, detach: bool = False,
            log: Callable[[str], None] = _quiet, stores: Stores | None = None) -> Planned:
    """What :func:`start` would create and submit, creating neither a store nor a run folder.

    Logs the plan, the layout (role map, memory, weight sync), the booking
    (:mod:`scalectl.job.booking`: the rate per step, measured on runs of ``stores`` when
    it holds some of this recipe on this hardware, else estimated; the steps the budget
    buys, the wall-clock, the checkpoint disk), for Slurm the jobs the time limit makes of
    it and the sbatch options missing (:func:`scalectl.launch.slurm.booking_lines`), and
    as warnings what ``scalectl validate`` refuses on this machine (a model or data path
    that is not here, which the cluster's nodes may still hold).

    Raises:
        UserError: an unknown launcher, a recipe that does not load, a tracker library
            missing, a layout the job would refuse, or an unsafe run name.
    """
    from scalectl.launch.registry import get_launcher

    recipe, kind, layout = _prepare(recipe_file, setup, overrides, launcher, True, log)
    run_name = check_name(name or f"{recipe.name}-s{recipe.seed}")
    run_dir = (Path(runs_dir) / run_name).resolve()
    booking, notes = _booking(recipe, kind, layout, stores)
    for line in notes:
        log(line)
    described = get_launcher(kind).dry_run(recipe, run_name, run_dir, detach=detach)
    return Planned(recipe, kind, run_name, run_dir, layout, described, booking,
                   tuple(n for n in notes if n.startswith("warning: ")))


def _booking(recipe, kind: str, layout, stores: Stores | None):
    """The dry run's booking (:func:`scalectl.job.booking.book`) and its lines: the budget at the
    measured or estimated rate, the Slurm time limits and options, and the file checks of
    ``validate`` as warnings."""
    from scalectl.job.booking import book, booking_lines, estimated_rate, measured_rate, reservation_line, reserve
    from scalectl.recipe.load import check_sources

    params = layout.memory.params if layout.memory is not None else None
    rate = None
    if stores is not None:
        try:
            with stores() as store:
                stored = [(r, store.points(r["id"])) for r in store.list_runs() if r.get("n_points")]
                rate = measured_rate(recipe, stored, str(store.path))
        except UserError:                  # no store here (or none readable): the estimate
            pass
    booking = book(recipe, params, rate or estimated_rate(recipe, params))
    lines = booking_lines(recipe, params, booking)
    if kind == "slurm":
        from scalectl.launch.slurm import booking_lines as slurm_lines
        from scalectl.launch.slurm import reservation

        lines += slurm_lines(recipe, booking.wall_seconds, booking.redo_seconds)
        booked = reservation(recipe, booking)
    else:
        booked = reserve(booking, recipe.hardware.devices)
    here = Path.cwd()
    lines += [f"warning: {msg} on this machine (from {here}; `scalectl validate` refuses it): the job fails at "
              "start unless the machines it runs on hold it there" for _key, msg in check_sources(recipe)]
    if booked is not None:              # the bottom line: what to book, all of it
        booking = replace(booking, reservation=booked)
        lines.append(reservation_line(recipe, booked))
    return booking, lines


def start(stores: Stores, recipe_file, *, setup=None, overrides: Sequence[str] = (), name: str | None = None,
          runs_dir: str | Path = "runs", launcher: str | None = None, detach: bool = False, reporter=None,
          log: Callable[[str], None] = _quiet, new_run: bool = False,
          hold: contextlib.ExitStack | None = None) -> Started:
    """Train a recipe: load and check it, then reuse, continue or extend the stored run of the
    same recipe content and seed (whatever its name), or create a new run; submit it or train it
    in this process.

    What the store holds for the recipe's content hash and seed (:func:`stored_run_for`), said
    in a ``note:`` line: a completed run is reused, nothing trained (:data:`REUSED`); a run whose
    job is alive is left to it, nothing started (:data:`ATTACHED`); a stopped one is resumed
    (:func:`resume`); a run of the same recipe and seed trained to a smaller budget is extended
    to this one (:func:`resume` with ``budget.steps``).  ``new_run``: train a new run regardless.
    ``hold``: as :func:`resume`'s, for a run continued or extended.

    Args:
        stores: opens the store (the module's docstring); the store is created if missing.
        recipe_file: a recipe file or preset name; ``setup`` likewise (default: the
            recipe's folder's ``tiny-cpu``); ``overrides``: ``KEY=VALUE`` (``--set``).
        name: the run's name (default ``RECIPE-sSEED``, numbered past names taken).
        launcher: ``local`` or ``slurm`` (default the recipe's ``launcher.type``).
        detach: a local run in a background process; a launcher that cannot train here
            (Slurm) always submits.
        reporter: training progress in this process (:class:`scalectl.rl.loop.Reporter`).
        log: progress messages (the plan, a stored run of the same recipe and seed, the
            run's name and folder).

    Returns:
        A :class:`Started`; a run trained here returns when it ends (Ctrl-C stops it at a
        checkpoint: :data:`STOPPED`; an error marks it failed: :data:`FAILED`).

    Raises:
        UserError: an unknown launcher, a recipe that does not load, a model or prompt set
            the job would refuse at start (:func:`scalectl.job.preflight.check_inputs`), a
            tracker library missing, a layout the job would refuse, a name taken or unsafe, a
            run folder that cannot be written (nothing is then stored).  A run of the name
            that failed at start (:func:`failed_at_start`) does not hold it: it is removed.
    """
    from scalectl.launch.base import RunSpec

    recipe, kind, _ = _prepare(recipe_file, setup, overrides, launcher, False, log)
    with stores(create=True) as store:
        base = check_name(name) if name else check_name(f"{recipe.name}-s{recipe.seed}",
                                                          "run name (from the recipe's name)")
        _free_failed_name(store, base, log)
        found = stored_run_for(store, recipe, prefer=base)
        if found is not None and not new_run:
            action, row, steps = found
            log(same_run_line(action, row, steps, recipe))
            if action in (REUSE, ATTACH):
                return Started(row["id"], row["name"], Path(row["run_dir"] or "."), row.get("launcher") or kind,
                               recipe, REUSED if action == REUSE else ATTACHED)
        elif found is not None:
            log(same_run_line(found[0], found[1], found[2], recipe, training_new=True))
        if found is None or new_run:
            run_name = base if name else unique_name(store, base, runs_dir)
            run_id, run_dir = create_run(store, recipe, run_name, runs_dir, launcher=kind)
    if found is not None and not new_run:           # RESUME or EXTEND: the stored run goes on
        more = [f"budget.steps={recipe.budget.steps}"] if found[0] == EXTEND else []
        return resume(stores, str(found[1]["id"]), overrides=more, launcher=launcher, detach=detach,
                      reporter=reporter, log=log, hold=hold)
    log(f"run {run_name} (id {run_id}), folder {run_dir}")
    return _hand_on(stores, RunSpec(run_id, run_name, run_dir, recipe), kind, detach, reporter)


def resume(stores: Stores, ref: str, *, overrides: Sequence[str] = (), launcher: str | None = None,
           detach: bool = False, reporter=None, log: Callable[[str], None] = _quiet,
           hold: contextlib.ExitStack | None = None) -> Started:
    """Continue run ``ref`` (name or id) from its last checkpoint, or extend a completed one.

    A completed run continues only with a raised budget (``overrides`` such as
    ``budget.steps=N`` above the steps it trained): from its final checkpoint, keeping
    every point it has.  The run folder's lock (:func:`scalectl.job.lock.run_folder_lock`)
    is held from before its files are read until the call returns, or, given ``hold``,
    until that stack closes.  Other arguments as :func:`start`.

    Its placement may change too (``overrides`` of :data:`scalectl.recipe.load.PLACEMENT_KEYS`,
    e.g. ``launcher.slurm.trainer_nodelist=...`` off a node that died): the next job goes
    there, and the run keeps its recipe hash and its points.

    Raises:
        UserError: an unknown launcher, no such run or no run folder, the folder held by
            another process, a run whose job is alive, a completed run without a raised
            budget, an override of anything but the budget and the placement, a placement
            its job would refuse, or a budget already spent.
    """
    from scalectl.launch.base import RunSpec

    check_launcher(launcher)
    with contextlib.ExitStack() as own:
        info, recipe = _prepare_resume(stores, ref, list(overrides), own if hold is None else hold, log, launcher)
        run_dir = Path(info["run_dir"])
        kind = launcher or info.get("launcher") or recipe.launcher.type
        log(f"resuming run {info['name']} from {run_dir}")
        return _hand_on(stores, RunSpec(info["id"], info["name"], run_dir, recipe), kind, detach, reporter)


def same_run_line(action: str, row: dict, steps: int, recipe, training_new: bool = False) -> str:
    """The ``note:`` line of :func:`start` on a stored run of the same recipe content and seed
    (``action`` of :func:`stored_run_for`, ``steps`` it has trained): what becomes of it, or, with
    ``training_new`` (``--new-run``), that a new run is trained regardless."""
    at = f" at step {steps}" if steps else ""
    head = f"note: run {row['name']} has this recipe and seed"
    if training_new:
        return f"{head} ({row['status']}{at}); --new-run: training a new run"
    if action == REUSE:
        return (f"{head} and completed{at}: reused, nothing trained (`scalectl show {row['name']}`; "
                f"--new-run trains another)")
    if action == ATTACH:
        return (f"{head} and is {row['status']}{at}: nothing started; follow it with "
                f"`scalectl logs {row['name']} --follow`")
    if action == RESUME:
        return f"{head} and stopped ({row['status']}){at}: resuming it"
    return (f"{head} and was trained to a smaller budget ({row['status']}{at}): extending it to "
            f"{recipe.budget.steps} steps instead of training from step 0")


def _prepare_resume(stores: Stores, ref: str, overrides: list[str], held: contextlib.ExitStack,
                    log: Callable[[str], None], launcher: str | None = None):
    """Check that run ``ref`` may be resumed, holding its folder's lock (in ``held``) from
    before its files are read; apply the ``--set`` overrides of its budget and its placement
    (:data:`scalectl.recipe.load.RESUME_KEYS`; a new placement checked for ``launcher``, default
    the run's).  Returns (the run's row, its recipe with the overrides); raises as :func:`resume`."""
    from scalectl.job.body import read_job_file, write_job_file
    from scalectl.job.lock import run_folder_lock
    from scalectl.recipe.load import BUDGET_KEYS, parse_override, resumed_recipe

    with stores(create=False) as store:
        info = store.get_run(ref)
    if not has_job_file(info):
        raise UserError(f"run {ref!r} has no run folder to resume from")
    run_dir, name = Path(info["run_dir"]), info["name"]
    held.enter_context(run_folder_lock(run_dir, name))
    with stores(create=False) as store:
        info, old = resumable(store, info["id"])                # read again, under the lock
        points = store.points(info["id"])
        recipe = resumed_recipe(old, overrides)
        extended = any(parse_override(o)[0] in BUDGET_KEYS for o in overrides)
        _check_budget(name, info["status"], recipe.budget, points, extended)
        if recipe.launcher != old.launcher:                      # placed elsewhere: checked before it is written
            _check_placement(recipe, launcher or info.get("launcher") or recipe.launcher.type, name, log)
        if recipe != old:
            job = read_job_file(run_dir)
            write_job_file(run_dir, db=job["db"], run_id=job["run_id"], recipe=recipe.to_dict())
            store.update_run(info["id"], recipe=recipe.to_dict(), recipe_hash=recipe.content_hash)
            if recipe.budget != old.budget:
                log(f"run {name}: budget {budget_text(recipe.budget)} (was {budget_text(old.budget)})")
            for key, (was, now) in placement_changes(old, recipe).items():
                log(f"run {name}: {key} = {now!r} (was {was!r}); its recipe hash stays {recipe.content_hash}")
    return info, recipe


def placement_changes(old, new) -> dict[str, tuple]:
    """``{key: (old value, new value)}`` for each of :data:`scalectl.recipe.load.PLACEMENT_KEYS`
    that differs between recipes ``old`` and ``new`` (None for a key not set)."""
    from scalectl.recipe.load import PLACEMENT_KEYS

    def value(recipe, key: str):
        node = recipe.to_dict()
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    return {k: (value(old, k), value(new, k)) for k in PLACEMENT_KEYS if value(old, k) != value(new, k)}


def _check_placement(recipe, kind: str, name: str, log: Callable[[str], None]) -> None:
    """Refuse a resumed run's new placement that its job would refuse: the layout
    (:func:`_check_layout`: node lists naming as many hosts as their role has nodes, no host for
    both roles) and, on Slurm, the sbatch parameters (:func:`scalectl.launch.slurm.submitit_parameters`:
    a safe partition name, host lists that parse).

    Raises:
        UserError: what is wrong; nothing has been written.
    """
    _check_layout(recipe, kind, False, log)
    if kind == "slurm":
        from scalectl.launch.slurm import submitit_parameters

        submitit_parameters(recipe, name)


def _check_budget(name: str, status: str, b, points: list[dict], overridden: bool) -> None:
    """Refuse to resume a completed run without a raised budget, or with a budget (``b``)
    its points have already spent."""
    done_steps = points[-1]["step"] if points else 0
    done_hours = (points[-1].get("gpu_hours") or 0.0) if points else 0.0
    if status == "completed" and not overridden:
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


def _hand_on(stores: Stores, spec, kind: str, detach: bool, reporter) -> Started:
    """Submit the run to its launcher (``detach``, or a launcher that cannot train here), else
    train it in this process as its foreground job (:func:`start_here`)."""
    from scalectl.launch.registry import get_launcher

    run = dict(run_id=spec.run_id, name=spec.name, run_dir=Path(spec.run_dir), launcher=kind, recipe=spec.recipe)
    if detach or not get_launcher(kind).runs_here:
        with stores(create=False) as store:
            job = submit(store, [spec], kind)[0]
        return Started(**run, outcome=SUBMITTED, job=job)
    with stores(create=False) as store:
        start_here(store, spec.run_id, spec.run_dir, kind)
    return Started(**run, **_train_here(Path(spec.run_dir), reporter))


def _train_here(run_dir: Path, reporter) -> dict:
    """Run the job body in this process: the outcome, and the summary or the error (its
    traceback written to ``RUN_DIR/error.log``; the job body marks the run failed)."""
    from scalectl.job.body import run_job

    try:
        return {"outcome": COMPLETED, "summary": run_job(run_dir, reporter=reporter)}
    except KeyboardInterrupt:
        return {"outcome": STOPPED}
    except UserError:
        raise
    except Exception as exc:  # the run is marked failed in the store; the traceback goes to its folder
        import traceback

        (run_dir / "error.log").write_text(traceback.format_exc())
        return {"outcome": FAILED, "error": str(exc) or type(exc).__name__, "error_log": run_dir / "error.log"}
