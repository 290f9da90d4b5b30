"""The body of a training job: what a launcher runs, on this machine or on a Slurm node.

A run folder holds ``job.json`` (the store path, the run id, the normalised
recipe) written when the run is created; :func:`run_job` needs nothing else,
so the same call serves ``scalectl run`` in the foreground, a local
background process and every task of a Slurm job.  The job body alone

* works out which task of the job it is (:func:`scalectl.rl.run.job_task`):
  a run in one process (``sync`` or ``ppo_off_policy`` with 1 generator + 1
  trainer) trains on task 0 and other tasks return at once; a run in processes
  (every other layout) runs every task's role, and the first trainer rank
  records the run (generators and the trainer ranks that follow it do not,
  except the failure of a job whose first trainer rank is gone, named by
  :class:`scalectl.rl.transport.board.TaskLost`); once a task has recorded that the job cannot go
  on (a task lost or stuck, :data:`scalectl.rl.transport.board.JOB_ENDING`), the launcher's
  ``end_job`` stops the job's other tasks (a Slurm job would otherwise wait for a dead node's
  tasks until Slurm marks the node down, then requeue the job);
* decides to resume: it does whenever the run folder holds a checkpoint;
* writes the run's status in the store: running, then completed, failed (with
  the error), cancelled, or what the launcher says an exception means
  (``timed_out``, ``pending`` when requeued); having recorded it cancelled, it tells the
  launcher (``on_cancelled``: a Slurm job then ends as Slurm's CANCELLED, not FAILED);
* stores the evaluation points and sends them, with each step's metrics, to the
  recipe's ``[logging]`` trackers (:mod:`scalectl.job.trackers`).

It writes points and statuses into the store itself only on the store's own host with the
store on a local file system; anywhere else (another node, a store on NFS) into the run's
journal, which the commands take into the store (:mod:`scalectl.job.journal`); its log says
which and why.

A simulated run (``model.path = "simulated:..."``, :mod:`scalectl.curve.simulated`)
stores points drawn from a given curve instead of training.

Launchers only submit, watch and cancel.
"""

from __future__ import annotations

import json
import os
import socket
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from scalectl.recipe.schema import Recipe
from scalectl.job.lock import run_folder_lock
from scalectl.rl.transport.board import JOB_ENDING, LOG_ENV
from scalectl.rl.transport.roles import GPU_ONLY
from scalectl.rl.checkpoint import latest_checkpoint
from scalectl.rl.data.splits import load_prompt_sets
from scalectl.rl.loop import Reporter
from scalectl.rl.run import job_task, run_training
from scalectl.rl.schedule.modes import schedule_for
from scalectl.curve.simulated import run_simulated
from scalectl.store.database import Store
from scalectl.job.journal import JobStore, StoreSink  # noqa: F401  (StoreSink: the direct sink, importable here)
from scalectl.job.trackers import run_key, tracking

JOB_FILE = "job.json"

#: ``stop_status(exc)`` -> (status, error) for an exception the launcher can explain, else None.
StopStatus = Callable[[BaseException], "tuple[str, str] | None"]
#: ``end_job(exc)``: stop every task of this job, after the run's failure ``exc`` is recorded.
EndJob = Callable[[BaseException], None]
#: ``on_cancelled()``: told that this task has recorded the run cancelled (after its checkpoint).
OnCancelled = Callable[[], None]


def write_job_file(run_dir: Path, *, db: str, run_id: int, recipe: dict) -> Path:
    """Write ``RUN_DIR/job.json`` (atomically), with this host as the store's host
    (``store_host``: a job elsewhere journals its run, :mod:`scalectl.job.journal`)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (JOB_FILE + ".tmp")
    tmp.write_text(json.dumps({"db": str(Path(db).resolve()), "run_id": run_id, "store_host": socket.gethostname(),
                               "recipe": recipe}, indent=2))
    tmp.replace(run_dir / JOB_FILE)
    return run_dir / JOB_FILE


def read_job_file(run_dir: Path) -> dict:
    """``RUN_DIR/job.json`` as a dict (db, run_id, store_host, recipe)."""
    return json.loads((Path(run_dir) / JOB_FILE).read_text())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_job(run_dir: str | Path, *, reporter=None, stop_status: StopStatus | None = None,
            task_log: str | None = None, end_job: EndJob | None = None,
            on_cancelled: OnCancelled | None = None) -> dict | None:
    """Train the run described by ``RUN_DIR/job.json`` and record its fate in the store.

    The first task of the job (the only one of a single-process job) holds the run
    folder's lock (:func:`scalectl.job.lock.run_folder_lock`) from before it reads
    the folder until the job ends: one job at a time trains a folder.

    Args:
        reporter: progress (:class:`scalectl.rl.loop.Reporter`).
        stop_status: the launcher's reading of an exception that stopped the job
            (e.g. Slurm's time limit -> ``timed_out``); its status and error are recorded
            instead of ``failed``.
        task_log: this task's log file, which the job's other tasks name if this task dies
            (:mod:`scalectl.rl.transport.board`; exported as ``$SCALECTL_TASK_LOG``).
        end_job: the launcher's way to stop every task of a multi-task job, called once this task
            has recorded the run failed because a task is lost or stuck (a Slurm job: ``scancel``).
        on_cancelled: called once this task has recorded the run cancelled (interrupted, its
            checkpoint saved), before the KeyboardInterrupt goes on (a Slurm job then ends as
            CANCELLED once every task has done its part: :class:`scalectl.launch.slurm.SlurmRunJob`).

    Returns:
        The training summary (steps, first and last pass rate, compute), or None in a
        task that does not record the run (a generator, a trainer rank after the first,
        or a task other than 0 when the run is in one process).

    Raises:
        UserError: another process holds the run folder.
        KeyboardInterrupt: re-raised after the run is checkpointed and marked cancelled.
        Exception: any training error, after the run is marked failed with it.
    """
    if task_log:
        os.environ[LOG_ENV] = str(task_log)
    hooks = {"reporter": reporter, "stop_status": stop_status, "end_job": end_job, "on_cancelled": on_cancelled}
    if int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))) != 0:
        return _run_job(run_dir, **hooks)
    with run_folder_lock(run_dir):
        return _run_job(run_dir, **hooks)


def _failure(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


def _run_job(run_dir: str | Path, *, reporter=None, stop_status: StopStatus | None = None,
             end_job: EndJob | None = None, on_cancelled: OnCancelled | None = None) -> dict | None:
    run_dir = Path(run_dir)
    reporter = reporter or Reporter()
    job = read_job_file(run_dir)
    recipe = Recipe.model_validate(job["recipe"])
    run_id = job["run_id"]
    simulated = recipe.model.path.startswith("simulated:")   # scalectl.curve.simulated: points from a given curve
    schedule = schedule_for(recipe.async_)      # the job's async mode, passed down from here
    task = None if simulated else job_task(recipe, schedule)
    hw = recipe.hardware
    if task is not None and task.role == GPU_ONLY:      # a GPU of a tensor-parallel generator
        reporter.log(f"task {task.rank} holds a GPU of generator {task.role_rank}, whose first task's vLLM "
                     "engine uses it; nothing to run here")
        return None
    if task is not None and task.world_size > 1 and task.rank != 0 \
            and not schedule.in_processes(hw.generators, hw.trainers):
        reporter.log(f"the training loop runs on task 0; task {task.rank} has nothing to do")
        return None
    resume = latest_checkpoint(run_dir) is not None
    out = JobStore(job, run_dir)           # the store itself, or the run's journal (another host, NFS)
    if task is not None and task.world_size > 1 and (task.role == "generator" or task.role_rank > 0):
        # a generator or a follower trainer: the first trainer rank records the run, unless it is gone
        train, held_out = load_prompt_sets(recipe, log=reporter.log)
        try:
            return run_training(recipe, run_dir, schedule=schedule, sink=out.sink,
                                train_problems=train, eval_problems=held_out, reporter=reporter, resume=resume,
                                task=task)
        except JOB_ENDING as exc:
            if exc.leader:                  # the task that records the run is gone: say so here
                out.update_run(status="failed", ended=_now(), error=_failure(exc))
                if end_job is not None:
                    end_job(exc)
            raise
    reporter.log(out.describe())
    out.update_run(status="running", started=_now(), error=None)
    try:
        if simulated and out.mode == "journal":
            summary = run_simulated(recipe, out, run_id)
        elif simulated:
            with Store.open(job["db"]) as store:
                summary = run_simulated(recipe, store, run_id)
        else:
            train, held_out = load_prompt_sets(recipe, log=reporter.log)
            out.update_run(warm_start=_warm_start(recipe, reporter))
            with tracking(recipe, run_dir, reporter, name=run_dir.name, resume=resume,
                          key=run_key(run_dir.name, job["db"], run_id)) as tracked:   # [logging] backends
                summary = run_training(recipe, run_dir, schedule=schedule, sink=out.sink,
                                       train_problems=train, eval_problems=held_out, reporter=tracked,
                                       resume=resume, task=task)
    except BaseException as exc:
        explained = stop_status(exc) if stop_status else None
        if explained is not None:
            status, error = explained
            out.update_run(status=status, error=error, ended=None if status == "pending" else _now())
        elif isinstance(exc, KeyboardInterrupt):
            out.update_run(status="cancelled", ended=_now(), error="interrupted (resume with --resume)")
            if on_cancelled is not None:
                on_cancelled()
        else:
            out.update_run(status="failed", ended=_now(), error=_failure(exc))
            if isinstance(exc, JOB_ENDING) and task is not None and task.world_size > 1 and end_job is not None:
                end_job(exc)
        raise
    out.update_run(status="completed", ended=_now(), error=None)   # clears what a launcher may have guessed
    if simulated:
        return summary
    points = out.points()
    first, last = (points[0]["pass_rate"], points[-1]["pass_rate"]) if points else (None, None)
    return {"steps": summary["steps"], "first_pass_rate": first, "last_pass_rate": last,
            **{k: v for k, v in summary.items() if k != "steps"}}


def _warm_start(recipe: Recipe, reporter) -> str:
    """The checkpoint the run starts from (built first if it is the tiny model's warm start), as
    the JSON the store's ``runs.warm_start`` holds; its source and checksum go to the log."""
    from scalectl.rl.train.warmstart import ensure_warm_start, warm_start_record

    path = recipe.model.path
    if path.startswith("builtin:"):
        path = ensure_warm_start(recipe, log=reporter.log)
    record = warm_start_record(path)
    sha = (record.get("sha256") or "-")[:12]
    reporter.log(f"starts from {record['source']} {record.get('name') or record['path']} (weights sha256 {sha})")
    return json.dumps(record, sort_keys=True)


def record_status(run_dir: str | Path, status: str, error: str | None = None) -> None:
    """Record a status for a job that ended before :func:`run_job` started (e.g. cancelled
    while waiting for a local slot): in the store or the run's journal, as the job would."""
    JobStore(read_job_file(run_dir), run_dir).update_run(status=status, error=error, ended=_now())
