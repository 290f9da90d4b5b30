"""Creating runs, and finding a stored run that already trains a given recipe.

A run is a row in the store plus a run folder holding ``job.json`` (the store
path, the run id and the normalised recipe): everything a launcher needs to
train it, here or on a Slurm node.  ``scalectl run`` and ``scalectl ablate``
create runs through :func:`create_run`, hand them to a launcher with
:func:`submit`, and stop them with :func:`cancel`.

Two runs with the same recipe content hash and seed train the same thing
(:attr:`scalectl.recipe.schema.Recipe.content_hash` leaves out the name, seed,
launcher and checkpoint frequency), so an ablation reuses such a run instead
of training it again: :func:`find_existing` picks the best one.
"""

from __future__ import annotations

from pathlib import Path

from scalectl.errors import UserError
from scalectl.names import check_name

#: What to do with a planned run, given the store.
REUSE, ATTACH, RESUME, NEW = "reuse", "attach", "resume", "new"


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


def submit(store, runs: list, kind: str, *, array: bool = False) -> list:
    """Hand runs already in the store to the launcher named ``kind`` and record their jobs.

    Each run is marked ``pending`` first (the job body marks it ``running`` itself).

    Args:
        runs: :class:`scalectl.launch.base.RunSpec` of each run.
        array: submit them together (:meth:`~scalectl.launch.base.Launcher.submit_many`:
            one Slurm job array); else one by one.

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
        jobs = launcher.submit_many(runs) if array else [launcher.submit(r) for r in runs]
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
