"""``scalectl import``: evaluation points from runs made elsewhere."""

from __future__ import annotations

from pathlib import Path
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


@user_errors
def import_(
    file: Annotated[Path, typer.Argument(help="CSV or JSONL of points: pass_rate and compute (GPU-hours), step, flops, tokens, ...")],
    name: Annotated[str, typer.Option(help="Name of the new run.")],
    hardware: Annotated[str, typer.Option(help="Hardware class the GPU-hours were measured on.")] = "",
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Import evaluation points of a run made elsewhere (all rows or none)."""
    from scalectl.names import check_name
    from scalectl.store.importer import import_points

    check_name(name)
    with open_store(db, create=True) as store:
        run_id, n = import_points(store, file, name, hardware=hardware)
    if json_:
        print_json({"run_id": run_id, "name": name, "points": n})
    else:
        err.print(f"imported {n} points into run {name!r} (id {run_id})")


def register(app: typer.Typer) -> None:
    """Add ``import`` to the app."""
    app.command("import")(import_)
