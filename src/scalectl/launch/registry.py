"""Launchers by name: ``launcher.type`` in a setup, ``--launcher`` on the command line.

A new launcher is a :class:`~scalectl.launch.base.Launcher` subclass in a module
of its own, its name in :data:`scalectl.recipe.launcher_choices.LAUNCHER_CHOICES`
(what ``launcher.type`` accepts) and its module here in :data:`LAUNCHERS` (module
and class name: a launcher's module is imported only when it is used, so that
``scalectl runs`` on runs that need no launcher starts without submitit).  :func:`refresh` keeps a run's
status in the store in step with its job (a job that died without recording
its end is marked failed here, with the tail of its log).
"""

from __future__ import annotations

import importlib

from scalectl.errors import UserError
from scalectl.launch.base import ACTIVE, TERMINAL, Launcher, last_job, log_tail, now_iso, reconcile
from scalectl.recipe.launcher_choices import LAUNCHER_NAMES

_MODULES = {"local": ("scalectl.launch.local", "LocalLauncher"),
            "slurm": ("scalectl.launch.slurm", "SlurmLauncher")}
#: Every name of :data:`~scalectl.recipe.launcher_choices.LAUNCHER_CHOICES` (the setup's
#: ``launcher.type``) -> (module, class name) of its :class:`~scalectl.launch.base.Launcher`,
#: in its order; a name without a module fails here.
LAUNCHERS: dict[str, tuple[str, str]] = {name: _MODULES[name] for name in LAUNCHER_NAMES}
LAUNCHER_TYPES = LAUNCHER_NAMES


def launcher_class(kind: str) -> type[Launcher]:
    """The :class:`~scalectl.launch.base.Launcher` subclass named ``kind`` (its module imported now).

    Raises:
        UserError: an unknown name (names the allowed ones).
    """
    try:
        module, name = LAUNCHERS[kind]
    except KeyError:
        raise UserError(f"launcher {kind!r} is not one of: {', '.join(LAUNCHERS)}") from None
    return getattr(importlib.import_module(module), name)


def get_launcher(kind: str) -> Launcher:
    """The launcher named ``kind``.

    Raises:
        UserError: an unknown name (names the allowed ones).
    """
    return launcher_class(kind)()


_REASONS = {
    "failed": "the job ended without recording a result",
    "cancelled": "the job was cancelled",
    "timed_out": "the job hit its time limit",
}


def refresh(store, run: dict, launcher: Launcher | None = None) -> dict:
    """Bring one run's status in the store up to date with its launcher.

    Args:
        store: an open :class:`scalectl.store.database.Store`.
        run: a row of :meth:`Store.list_runs` / :meth:`Store.get_run`.
        launcher: the launcher to ask (default: the one recorded for the job).

    Returns:
        ``run`` with ``status`` (and ``error``, ``ended``) updated, plus
        ``job_id``, ``launcher_state`` (the launcher's raw word) and
        ``restarts``.
    """
    run = dict(run)
    job = last_job(run.get("run_dir"))
    run["job_id"] = job.job_id if job else None
    run["launcher_state"] = None
    run["restarts"] = 0
    if job is None:
        return run
    try:
        launcher = launcher or get_launcher(job.launcher)
        seen = launcher.state(job)
    except UserError as exc:            # e.g. Slurm not reachable from here
        run["launcher_state"] = f"unknown ({exc})"
        return run
    run["launcher_state"], run["restarts"] = seen.raw, seen.restarts
    new = reconcile(run["status"], seen.state)
    if new is None:
        return run
    fields: dict = {"status": new}
    if new in TERMINAL:
        fields["ended"] = now_iso()
        tail = log_tail(job.log)
        reason = f"{_REASONS.get(new, new)} ({launcher.name} job {job.job_id}: {seen.raw})"
        fields["error"] = reason + (f"; log tail:\n{tail}" if tail and new != "cancelled" else "")
    elif new == "pending" and run["status"] == "running":
        fields["error"] = f"requeued ({launcher.name} job {job.job_id}: {seen.raw}); resumes from its last checkpoint"
    store.update_run(run["id"], **fields)
    run.update(fields)
    return run


def current_runs(store, wanted: set[int] | None = None) -> list[dict]:
    """Every run (or those with ids in ``wanted``) with its status brought up to date by
    :func:`refresh`: what ``scalectl runs`` and ``scalectl status`` both show, so that
    they never disagree (a job killed outright reads as failed in both).  A read-only
    store is shown as it is."""
    rows = []
    for r in store.list_runs():
        if wanted is not None and r["id"] not in wanted:
            continue
        if r.get("status") in ACTIVE and r.get("source") != "import" and not getattr(store, "readonly", False):
            r = refresh(store, r)
        else:
            r = dict(r, job_id=(r.get("job_ids") or [None])[-1], launcher_state=None, restarts=0)
        rows.append(r)
    return rows
