"""Start one run's training: the schedule of ``async.mode`` decides how.

* in one process (``sync`` and ``ppo_off_policy`` with 1 generator + 1 trainer,
  :meth:`scalectl.recipe.async_modes.AsyncMode.in_processes`): the RL loop runs here,
  generating its own batches;
* in processes (``pipeline``; ``sync`` and ``ppo_off_policy`` with more
  generators or trainers): in a multi-task job (Slurm, or ``RANK``/``WORLD_SIZE``
  in the environment) this process is the task :func:`scalectl.rl.transport.roles.detect`
  names; otherwise the generators and the trainers are spawned here and
  supervised (:func:`scalectl.rl.processes.supervise.supervise`).

Evaluation points leave through ``sink``; nothing here knows where they are stored.
"""

from __future__ import annotations

from pathlib import Path

from scalectl.rl.processes.threads import set_cpu_threads
from scalectl.rl.loop import Reporter, prepare, train
from scalectl.rl.processes.bodies import ProcessSpec, run_role
from scalectl.rl.processes.supervise import supervise
from scalectl.rl.transport.roles import Task, detect
from scalectl.rl.schedule.modes import Schedule
from scalectl.rl.train.warmstart import ensure_warm_start


def job_task(recipe, schedule: Schedule) -> Task:
    """This process's task in its job (role, rank), checked against ``hardware`` when the
    run is in processes (:meth:`~scalectl.rl.schedule.modes.Schedule.in_processes`).

    Args:
        schedule: the job's :class:`~scalectl.rl.schedule.modes.Schedule` (of ``recipe.async_``).

    Raises:
        UserError: the job's tasks do not match the recipe's hardware.
    """
    hw = recipe.hardware
    return detect(hw.generators, hw.trainers, strict=schedule.in_processes(hw.generators, hw.trainers),
                  gpus_per_generator=hw.gpus_per_generator)


def run_training(recipe, run_dir: Path, *, schedule: Schedule, sink, train_problems: list, eval_problems: list,
                 reporter: Reporter | None = None, resume: bool = False, task: Task | None = None) -> dict | None:
    """Train ``recipe`` until its budget is spent.

    Args:
        recipe: the validated :class:`~scalectl.recipe.schema.Recipe`.
        run_dir: the run folder (checkpoints, ``steps.jsonl``, process logs).
        schedule: the job's :class:`~scalectl.rl.schedule.modes.Schedule`
            (:func:`~scalectl.rl.schedule.modes.schedule_for` of ``recipe.async_``, built once per job).
        sink: ``sink(point)`` stores each :class:`~scalectl.points.EvalPoint`; with a
            run in processes it runs in the first trainer process, so it must pickle.
        train_problems, eval_problems: disjoint prompt sets.
        reporter: progress.
        resume: continue from the latest checkpoint in ``run_dir``.
        task: this process's task (default: :func:`job_task`).

    Returns:
        The loop's summary (steps, gpu_hours, flops, retired_prompts); None in a
        generator task of a multi-task job.

    Raises:
        KeyboardInterrupt: interrupted, after a checkpoint.
        scalectl.rl.processes.supervise.ProcessFailed: a process of a run in processes failed.
        UserError: see :func:`job_task`.
    """
    reporter = reporter or Reporter()
    task = task or job_task(recipe, schedule)
    run_dir = Path(run_dir)
    if not schedule.in_processes(recipe.hardware.generators, recipe.hardware.trainers):
        set_cpu_threads(recipe.hardware, processes=1)   # one process generates and trains: every core
        policy, state = prepare(recipe, run_dir, len(train_problems), reporter, resume)
        source = schedule.batches(recipe, policy, state, train_problems)
        return train(recipe, policy, state, source, schedule=schedule, run_dir=run_dir, eval_problems=eval_problems,
                     sink=sink, reporter=reporter)
    spec = ProcessSpec(recipe.to_dict(), str(run_dir.resolve()), sink, resume, train_problems, eval_problems,
                       schedule)
    if task.world_size > 1:
        return run_role(spec, task, reporter)
    if recipe.model.path.startswith("builtin:"):      # build the warm start once, before the processes
        ensure_warm_start(recipe, log=reporter.log)
    return supervise(spec, recipe.hardware.generators, reporter, trainers=recipe.hardware.trainers)
