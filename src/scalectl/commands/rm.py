"""``scalectl rm``: remove runs, their points and their run folders."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from scalectl.commands.common import (
    DbOption,
    JsonOption,
    err,
    open_store,
    print_json,
    user_errors,
)
from scalectl.errors import UserError


@user_errors
def rm(
    runs: Annotated[list[str], typer.Argument(help="Run names or ids.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Remove without asking.")] = False,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Remove runs: each one's row, evaluation points, series and fits, and its run folder
    (checkpoints, logs) when the folder is the run's.

    Asks first, unless --yes.  A run whose job is pending or running is refused (cancel it
    first); a folder that holds another store's run is kept.
    """
    from scalectl.launch.runs import removal, remove_run

    with open_store(db) as store:
        planned = [removal(store, ref) for ref in runs]
        ids = [info["id"] for info, _ in planned]
        if len(set(ids)) != len(ids):
            raise UserError(f"a run is named twice: {runs}")
        for info, folder in planned:
            n = len(store.points(info["id"]))
            err.print(f"run {info['name']} (id {info['id']}, {info['status']}): {n} point(s), "
                      f"{sum(s['points'] for s in store.series(info['id']))} series point(s), "
                      f"folder {folder or '- (none of its own)'}", markup=False, soft_wrap=True)
        if not yes:
            if not sys.stdin.isatty():
                raise UserError("rm: stdin is not a terminal to confirm on; add --yes to remove without asking")
            typer.confirm(f"remove {len(planned)} run(s)?", abort=True, err=True)
        removed = [remove_run(store, info["id"]) for info, _ in planned]
    if json_:
        print_json([{"run": r.run["name"], "run_id": r.run["id"], "rows": r.rows,
                     "folder": None if r.folder is None else str(r.folder)} for r in removed])
        return
    for r in removed:
        err.print(f"removed run {r.run['name']}" + (f" and {r.folder}" if r.folder else ""), markup=False)


def register(app: typer.Typer) -> None:
    """Add ``rm`` to the app."""
    app.command()(rm)
