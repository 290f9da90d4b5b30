"""``scalectl runs``: every run in the store, its status and last point."""

from __future__ import annotations

import typer

from scalectl.commands.common import (
    DbOption,
    FormatOption,
    JsonOption,
    open_store,
    print_json,
    user_errors,
)


@user_errors
def runs(db: DbOption = None, json_: JsonOption = False, fmt: FormatOption = "table") -> None:
    """List every run in the store with its status and last evaluation point.

    The status of a run whose job should be alive is checked with its launcher,
    as `scalectl status` does (a job killed outright shows as failed).  At a narrow terminal the
    least useful columns are dropped (named under the table); in a pipe or a file every column
    is printed whole (--format csv: as CSV)."""
    from scalectl.launch.registry import current_runs

    with open_store(db) as store:
        rows = current_runs(store)
    if json_ or fmt == "json":
        print_json([{k: v for k, v in r.items() if k != "recipe"} for r in rows])
        return
    from scalectl.display import Column, TableData, format_number
    from scalectl.present.console import print_table

    cols = [Column("id", priority=1), Column("name", "left", keep=True), Column("hash", "left", priority=0),
            Column("status", "left", keep=True), Column("launcher", "left", priority=2),
            Column("hardware", "left", priority=3), Column("points", priority=5),
            Column("last step", priority=4), Column("pass rate", keep=True), Column("trunc.", priority=6)]
    print_table(TableData(f"runs in {db or 'the store'}", cols, [
        [str(r["id"]), r["name"], r["recipe_hash"] or "-", r["status"], r["launcher"] or "-",
         r["hardware"] or "-", str(r["n_points"]),
         *(format_number(r[k], decimals=True) for k in ("last_step", "last_pass_rate", "last_truncation_rate"))]
        for r in rows]), fmt)


def register(app: typer.Typer) -> None:
    """Add ``runs`` to the app."""
    app.command()(runs)
