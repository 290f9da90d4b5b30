"""``scalectl logs``: a run's job output, once or followed."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.bounds import number
from scalectl.commands.common import DbOption, err, open_store, user_errors
from scalectl.errors import UserError


def _run_status(db, run_id: int) -> str:
    from scalectl.launch.base import ACTIVE
    from scalectl.launch.registry import refresh

    with open_store(db) as store:
        info = store.get_run(run_id)
        if info["status"] in ACTIVE:
            info = refresh(store, info)
        return info["status"]


@user_errors
def logs(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    lines: Annotated[int | None, typer.Option("--lines", "-n", callback=number(0, 10**9),
                                              help="Only the last N lines.")] = None,
    task: Annotated[int, typer.Option(callback=number(0, 10**6), help="Task of a multi-task Slurm job.")] = 0,
    db: DbOption = None,
) -> None:
    """Print a run's job log (stdout and stderr of its latest job)."""
    from scalectl.launch.base import TERMINAL, last_job, log_tail
    from scalectl.launch.registry import get_launcher

    with open_store(db) as store:
        info = store.get_run(run)
    job = last_job(info.get("run_dir"))
    if job is None:
        raise UserError(f"run {info['name']} has no job (status {info['status']})")
    if not job.log:
        raise UserError(f"run {info['name']} trained in the foreground: its output went to that terminal; "
                        f"its steps are in {Path(job.run_dir) / 'steps.jsonl'}")
    paths = get_launcher(job.launcher).log_paths(job)
    if not 0 <= task < len(paths):
        raise UserError(f"--task {task} is not a task of job {job.job_id} (0..{len(paths) - 1})")
    path = paths[task]
    err.print(f"{job.launcher} job {job.job_id}, log {path}", highlight=False)
    pos = 0
    if path.exists():
        if lines is not None:
            sys.stdout.write(log_tail(path, lines) + "\n")
            pos = path.stat().st_size
        else:
            pos = _copy_from(path, 0)
    elif not follow:
        err.print("no log yet (the job has not started)")
    if not follow:
        return
    try:
        last_check = 0.0
        while True:
            if path.exists():
                pos = _copy_from(path, pos)
            if time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                state = _run_status(db, info["id"])
                if state in TERMINAL:
                    time.sleep(0.3)
                    if path.exists():
                        _copy_from(path, pos)
                    err.print(f"run {info['name']} is {state}")
                    return
            time.sleep(0.25)
    except KeyboardInterrupt:
        return


def _copy_from(path: Path, pos: int) -> int:
    """Write ``path`` from byte ``pos`` to stdout; return the new position."""
    with path.open("rb") as fh:
        if fh.seek(0, 2) < pos:       # truncated: start over
            pos = 0
        fh.seek(pos)
        data = fh.read()
    if data:
        sys.stdout.write(data.decode("utf-8", errors="replace"))
        sys.stdout.flush()
    return pos + len(data)


def register(app: typer.Typer) -> None:
    """Add ``logs`` to the app."""
    app.command()(logs)
