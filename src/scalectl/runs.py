"""Creating runs, and finding a stored run that already trains a given recipe.

A run is a row in the store plus a run folder holding ``job.json`` (the store
path, the run id and the normalised recipe): everything a launcher needs to
train it, here or on a Slurm node.  ``scalectl run`` and ``scalectl ablate``
create runs through :func:`create_run`.

Two runs with the same recipe content hash and seed train the same thing
(:attr:`scalectl.recipe.Recipe.content_hash` leaves out the name, seed,
launcher and checkpoint frequency), so an ablation reuses such a run instead
of training it again: :func:`find_existing` picks the best one.
"""

from __future__ import annotations

from pathlib import Path

from scalectl.names import check_name

#: What to do with a planned run, given the store.
REUSE, ATTACH, RESUME, NEW = "reuse", "attach", "resume", "new"


def unique_name(store, base: str) -> str:
    """``base``, or ``base-2``, ``base-3``, ... : the first name not in the store."""
    taken = {r["name"] for r in store.find_runs(name_prefix=base)}
    if base not in taken:
        return base
    i = 2
    while f"{base}-{i}" in taken:
        i += 1
    return f"{base}-{i}"


def create_run(store, recipe, name: str, runs_dir: str | Path, launcher: str = "local") -> tuple[int, Path]:
    """Insert run ``name`` for ``recipe`` (a :class:`scalectl.recipe.Recipe`) and
    write its folder ``RUNS_DIR/NAME/job.json``.

    Returns:
        (run id, absolute run folder).

    Raises:
        UserError: an unsafe name (:func:`scalectl.names.check_name`) or a run
            of that name already in the store.
    """
    from scalectl.job import write_job_file

    check_name(name)
    run_dir = (Path(runs_dir) / name).resolve()
    run_id = store.create_run(name, recipe=recipe.to_dict(), recipe_hash=recipe.content_hash,
                              seed=recipe.seed, launcher=launcher, hardware=recipe.hardware.name,
                              run_dir=str(run_dir))
    write_job_file(run_dir, db=store.path, run_id=run_id, recipe=recipe.to_dict())
    return run_id, run_dir


def has_job_file(run: dict) -> bool:
    """Whether the run has a folder with ``job.json`` (so it can be launched or resumed)."""
    from scalectl.job import JOB_FILE

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
