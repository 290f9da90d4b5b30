"""``scalectl cancel``: checkpoint and stop a run's job."""

from __future__ import annotations

from typing import Annotated

import typer

from scalectl.commands.common import (
    DbOption,
    JsonOption,
    err,
    open_store,
    out,
    print_json,
    user_errors,
)


@user_errors
def cancel(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Stop a run's job (local: SIGINT, then SIGKILL; Slurm: scancel).

    A local job saves a checkpoint on SIGINT and is killed if it has not
    stopped within 60 s.  Continue later with `scalectl run --resume RUN`.
    """
    from scalectl.launch.runs import cancel as cancel_run

    with open_store(db) as store:
        final, job, alive = cancel_run(store, run, log=lambda m: err.print(m, highlight=False))
    if not alive:
        msg = f"run {final['name']} is already {final['status']}"
    elif job is None:
        msg = f"run {final['name']} cancelled (no job had started)"
    else:
        msg = (f"run {final['name']} cancelled ({job.launcher} job {job.job_id}); "
               f"continue with: scalectl run --resume {final['name']}")
    if json_:
        print_json({"run": final["name"], "status": final["status"], "job_id": job.job_id if job else None})
    else:
        out.print(msg)


def register(app: typer.Typer) -> None:
    """Add ``cancel`` to the app."""
    app.command()(cancel)
