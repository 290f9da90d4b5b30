"""``scalectl export``: a run's checkpoint as a transformers folder."""

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
def export(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    folder: Annotated[Path, typer.Argument(help="A new (or empty) folder to write the model to.")],
    step: Annotated[int | None, typer.Option("--step", help="The checkpoint of this step (default: the latest).")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Write a run's checkpoint as a transformers folder (save_pretrained: weights, config,
    generation config, tokenizer) that AutoModelForCausalLM, vLLM and lm-eval load."""
    from scalectl.job.checkpoints import export_checkpoint, run_checkpoints

    with open_store(db) as store:
        info, recipe, checkpoints = run_checkpoints(store, run, step)
    ((at, path),) = checkpoints.items()
    written = export_checkpoint(recipe, path, folder)
    if json_:
        print_json({"run": info["name"], "step": at, "checkpoint": str(path), "folder": str(written)})
    else:
        err.print(f"wrote run {info['name']} at step {at} to {written}", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``export`` to the app."""
    app.command()(export)
