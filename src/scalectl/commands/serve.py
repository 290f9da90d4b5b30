"""``scalectl serve``: browse the store in Datasette, with canned queries for runs, points, fits, ablations."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.common import DbOption, err, user_errors
from scalectl.errors import UserError


def metadata_for(db_path: Path) -> dict:
    """The packaged Datasette metadata (``presets/datasette.json``), its canned queries
    attached to the database Datasette names after the file's stem."""
    from scalectl import presets

    meta = json.loads((presets.root() / "datasette.json").read_text())
    meta["databases"] = {db_path.stem: next(iter(meta["databases"].values()))}
    return meta


@user_errors
def serve(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one).", min=0, max=65535)] = 8001,
    open_browser: Annotated[bool, typer.Option("--open", help="Open a browser on the page.")] = False,
) -> None:
    """Browse the store in Datasette, read-only, with canned queries: runs, points, fits, ablations.

    Needs the serve extra (pip install 'scalectl\\[serve]').  Without scalectl:
    `datasette scalectl.db -m datasette.json` with the file `scalectl init` copies.
    """
    import importlib.util

    from scalectl.store.database import default_db_path

    if importlib.util.find_spec("datasette") is None:
        raise UserError("scalectl serve needs Datasette: pip install 'scalectl[serve]'")
    path = Path(db or default_db_path())
    if not path.is_file():
        raise UserError(f"{path}: no store there (`scalectl run` creates one; --db or $SCALECTL_DB name another)")
    fd, meta_path = tempfile.mkstemp(prefix="scalectl-datasette-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(metadata_for(path), fh)
    # Datasette runs its queries on read-only connections (SQLite mode=ro); running jobs may keep writing
    args = ["serve", str(path), "--metadata", meta_path, "--host", host, "--port", str(port),
            "--setting", "default_page_size", "50"] + (["--open"] if open_browser else [])
    err.print(f"serving {path} read-only at http://{host}:{port}/{path.stem} (Ctrl-C stops)")
    from datasette.cli import cli

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)    # uvicorn re-raises SIGTERM after its shutdown: clean up then
    try:
        cli.main(args=args, prog_name="datasette", standalone_mode=False)   # uvicorn stops on SIGINT/SIGTERM
    except KeyboardInterrupt:
        pass
    finally:
        os.unlink(meta_path)


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the app."""
    app.command()(serve)
