"""``scalectl init``: copy the presets into a folder for editing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.common import JsonOption, out, print_json, user_errors


@user_errors
def init(
    directory: Annotated[Path, typer.Argument(metavar="[DIR]", help="Folder to fill (default: this one).")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Replace files that already exist.")] = False,
    json_: JsonOption = False,
) -> None:
    """Copy the presets (recipes/, setups/, ablations/) and the Datasette metadata into DIR for editing.

    In DIR, a bare name then means your copy: `scalectl run scalerl` reads
    recipes/scalerl.toml there before the packaged preset.
    """
    from scalectl import presets

    written = presets.copy_to(directory, overwrite=force)
    if json_:
        print_json([str(p) for p in written])
        return
    for kind in presets.KINDS:
        n = sum(1 for p in written if p.parent.name == kind)
        out.print(f"{directory / kind}/: {n} file(s)")
    out.print(f"wrote {len(written)} file(s) in {directory}; try: "
              f"cd {directory} && scalectl run {presets.DEFAULT_RECIPE}")


def register(app: typer.Typer) -> None:
    """Add ``init`` to the app."""
    app.command()(init)
