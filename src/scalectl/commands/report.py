"""``scalectl report``: an ablation's report, HTML with its figures and a Markdown summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.common import (
    BootstrapOption,
    DbOption,
    JsonOption,
    MarginChoiceOption,
    open_store,
    print_ablation,
    user_errors,
)


@user_errors
def report(
    ablation: Annotated[str, typer.Argument(metavar="ABLATION", help="Ablation name or file (ablations/*.toml).")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="Report folder (default reports/NAME).")] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where ablation manifests are (RUNS_DIR/.ablations).")] = Path("runs"),
    margin: MarginChoiceOption = None,
    bootstrap: BootstrapOption = 1000,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Write an ablation's report: index.html (figures embedded) and summary.md.

    ABLATION is the name given to `scalectl ablate` (its manifest in
    RUNS_DIR/.ablations) or an ablation file; without a manifest the runs are
    found by their names NAME--VARIANT--sSEED (imported curves too).
    """
    from scalectl.ablation.campaign import find_manifest
    from scalectl.ablation.report import build_report

    with open_store(db) as store:
        manifest = find_manifest(store, ablation, runs_dir)
        path = store.path
    result, paths = build_report(path, manifest, out_dir or Path("reports") / manifest["name"],
                                 bootstrap=bootstrap, margin=margin)
    print_ablation(result, paths, {"result": result.to_dict(), "report": {k: str(v) for k, v in paths.items()}}
                   if json_ else None)


def register(app: typer.Typer) -> None:
    """Add ``report`` to the app."""
    app.command()(report)
