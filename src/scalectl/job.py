"""The body of a training job: what a launcher runs, on this machine or on a Slurm node.

A run folder holds ``job.json`` (the store path, the run id, the normalised
recipe) written when the run is created; :func:`run_job` needs nothing else,
so the same call serves ``scalectl run`` in the foreground, a local
background process and a Slurm task.  The run's status in the store follows
the job: running, then completed, failed (with the error) or cancelled.
"""

from __future__ import annotations

import json
import traceback
from datetime import datetime, timezone
from pathlib import Path

JOB_FILE = "job.json"


def write_job_file(run_dir: Path, *, db: str, run_id: int, recipe: dict) -> Path:
    """Write ``RUN_DIR/job.json`` (atomically)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (JOB_FILE + ".tmp")
    tmp.write_text(json.dumps({"db": str(Path(db).resolve()), "run_id": run_id, "recipe": recipe}, indent=2))
    tmp.replace(run_dir / JOB_FILE)
    return run_dir / JOB_FILE


def read_job_file(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / JOB_FILE).read_text())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_job(run_dir: str | Path, *, resume: bool = False, reporter=None) -> dict:
    """Train the run described by ``RUN_DIR/job.json`` and record its fate in the store.

    Returns:
        The training summary (:func:`scalectl.rl.loop.run_training`).

    Raises:
        KeyboardInterrupt: re-raised after the run is checkpointed and marked cancelled.
        Exception: any training error, after the run is marked failed with it.
    """
    from scalectl.recipe import Recipe
    from scalectl.rl.data import load_prompt_sets
    from scalectl.rl.loop import run_training
    from scalectl.store import Store
    from scalectl.trackers import run_key, tracking

    run_dir = Path(run_dir)
    job = read_job_file(run_dir)
    recipe = Recipe.model_validate(job["recipe"])
    simulated = recipe.model.path.startswith("simulated:")   # scalectl.simulated: points from a given curve
    if recipe.async_.mode == "pipeline" and not simulated:
        from scalectl.rl.pipeline import generator_task, run_generator_task

        if generator_task(recipe) is not None:    # a generator task of a multi-task job: the trainer task
            return run_generator_task(run_dir, job, resume=resume, reporter=reporter)   # records the run
    store = Store.open(job["db"])
    run_id = job["run_id"]
    store.update_run(run_id, status="running", started=_now(), error=None)
    try:
        if simulated:
            from scalectl.simulated import run_simulated

            summary = run_simulated(recipe, store, run_id)
        else:
            train, held_out = load_prompt_sets(recipe)
            with tracking(recipe, run_dir, reporter, name=run_dir.name, resume=resume,
                          key=run_key(run_dir.name, job["db"], run_id)) as reporter:   # [logging] backends
                summary = run_training(recipe, run_dir, store, run_id, train_problems=train,
                                       eval_problems=held_out, reporter=reporter, resume=resume)
    except KeyboardInterrupt:
        store.update_run(run_id, status="cancelled", ended=_now(), error="interrupted (resume with --resume)")
        raise
    except BaseException as exc:
        store.update_run(run_id, status="failed", ended=_now(),
                         error="".join(traceback.format_exception_only(exc)).strip())
        raise
    else:
        store.update_run(run_id, status="completed", ended=_now())
        return summary
    finally:
        store.close()
