"""``scalectl recipes``: the presets shipped in the package, with descriptions and hashes."""

from __future__ import annotations

import typer
from rich.table import Table

from scalectl.commands.common import JsonOption, err, out, print_json, user_errors


@user_errors
def recipes(json_: JsonOption = False) -> None:
    """List the presets: recipes (with their content hash on the default setup), setups, ablations.

    Each name runs from any folder: `scalectl run NAME`, `--setup NAME`,
    `scalectl ablate NAME`; `scalectl init DIR` copies them for editing.  In a
    folder with such copies (recipes/, setups/, ablations/), a name means the copy
    there, and the list shows it (`here`) with its own hash.
    """
    from pathlib import Path

    from scalectl import presets
    from scalectl.recipe.load import find_default_setup, load

    rows = []
    for kind in presets.KINDS:
        here = {p.stem for p in Path(kind).glob("*.toml") if p.is_file()}
        for name in sorted(set(presets.names(kind)) | here):
            path = presets.resolve(name, kind)
            row = {"kind": kind[:-1], "name": name, "description": presets.description(path),
                   "hash": None, "file": str(path), "where": "here" if name in here else "packaged"}
            if kind == "recipes":
                row["hash"] = load(path, find_default_setup(path)).content_hash
            rows.append(row)
    if json_:
        print_json(rows)
        return
    table = Table(title=f"presets (recipe hashes on setup {find_default_setup('scalerl')})")
    for col in ("kind", "name", "where", "hash", "description"):
        table.add_column(col, no_wrap=col != "description")
    for r in rows:
        table.add_row(r["kind"], r["name"], r["where"], r["hash"] or "-", r["description"])
    out.print(table)
    local = " and ./recipes, ./setups, ./ablations (here)" if any(r["where"] == "here" for r in rows) else ""
    err.print(f"files in {presets.root()}{local}; copy them for editing with `scalectl init DIR`")


def register(app: typer.Typer) -> None:
    """Add ``recipes`` to the app."""
    app.command()(recipes)
