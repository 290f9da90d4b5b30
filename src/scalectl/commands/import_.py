"""``scalectl import``: evaluation points from runs made elsewhere."""

from __future__ import annotations

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
    source: Annotated[str, typer.Argument(
        help="A CSV or JSONL file of points (pass_rate and compute: GPU-hours, step, flops, tokens, ...), a W&B "
             "CSV export, a TensorBoard event folder, or an MLflow tracking store (sqlite:///mlflow.db, a "
             "mlruns folder).")],
    name: Annotated[str, typer.Option(help="Name of the new run.")],
    hardware: Annotated[str, typer.Option(help="Hardware class the GPU-hours were measured on.")] = "",
    map_: Annotated[list[str], typer.Option(
        "--map", metavar="COLUMN=FIELD", help="Read a column (a CSV header, a TensorBoard tag, an MLflow metric) "
                                              "as a field of the point, e.g. 'val/acc=pass_rate' (repeatable).")] = [],
    tag: Annotated[str | None, typer.Option(
        "--tag", help="The column holding the pass rate (default: pass_rate, or eval/pass_rate as scalectl "
                      "logs it).")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="The MLflow run to import: its id or name (default: the store's only run).")] = None,
    hours_per_step: Annotated[float | None, typer.Option(
        "--hours-per-step", help="GPU-hours per optimiser step: gpu_hours = step x this.")] = None,
    devices: Annotated[int | None, typer.Option(
        "--devices", help="Devices of the run: gpu_hours = runtime (_runtime or wall_seconds, s) / 3600 x "
                          "devices.")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Import evaluation points of a run made elsewhere (all rows or none).

    Columns that are not fields of a point are left out, and rows without a pass rate (a
    W&B export's training rows) skipped, each said in a note; so is where the GPU-hours
    came from.
    """
    from scalectl.names import check_name
    from scalectl.store.importer import import_points

    check_name(name)
    notes: list[str] = []
    with open_store(db, create=True) as store:
        run_id, n = import_points(store, source, name, hardware=hardware, notes=notes, maps=map_, tag=tag,
                                  run=run, hours_per_step=hours_per_step, devices=devices)
    if json_:
        print_json({"run_id": run_id, "name": name, "points": n, "notes": notes})
        return
    for note in notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    err.print(f"imported {n} points into run {name!r} (id {run_id})", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``import`` to the app."""
    app.command("import")(import_)
