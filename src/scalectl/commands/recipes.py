"""``scalectl recipes``: the presets shipped in the package, with descriptions and hashes."""

from __future__ import annotations

import typer

from scalectl.commands.common import FormatOption, JsonOption, err, print_json, user_errors
from scalectl.display import Column, TableData


@user_errors
def recipes(json_: JsonOption = False, fmt: FormatOption = "table") -> None:
    """List the presets: recipes (with their content hash on the default setup), setups, ablations.

    Each name runs from any folder: `scalectl run NAME`, `--setup NAME`,
    `scalectl ablate NAME`; `scalectl init DIR` copies them for editing.  In a
    folder with such copies (recipes/, setups/, ablations/), a name means the copy
    there, and the list shows it (`here`) with its own hash.  At a terminal the descriptions
    wrap to its width; in a pipe or a file each row is one line (--format csv: as CSV).
    """
    from pathlib import Path

    from scalectl import presets
    from scalectl.present.console import print_table
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
    if json_ or fmt == "json":
        print_json(rows)
        return
    # every column kept: at a narrow terminal the descriptions wrap (at spaces), nothing is dropped
    cols = [Column(c, "left", keep=True) for c in ("kind", "name", "where", "hash", "description")]
    print_table(TableData(f"presets (recipe hashes on setup {find_default_setup('scalerl')})", cols,
                          [[r["kind"], r["name"], r["where"], r["hash"] or "-", r["description"]] for r in rows]),
                fmt)
    local = " and ./recipes, ./setups, ./ablations (here)" if any(r["where"] == "here" for r in rows) else ""
    err.print(f"files in {presets.root()}{local}; copy them for editing with `scalectl init DIR`")


def register(app: typer.Typer) -> None:
    """Add ``recipes`` to the app."""
    app.command()(recipes)
