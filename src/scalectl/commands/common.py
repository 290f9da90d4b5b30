"""Plumbing shared by every CLI command: the store option, JSON output, errors.

Commands print human output with rich on stdout, or with ``--json`` only JSON
on stdout; progress and logs go to stderr.  A :class:`~scalectl.errors.UserError`
becomes its message on stderr and exit status 2.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Annotated, Any, Callable

import typer
from rich.console import Console
from rich.markup import escape

from scalectl.errors import UserError

#: Human output.  Lines are not wrapped: a terminal folds them itself, and text written to a
#: file or a pipe (a command to copy, the TOML ``validate`` prints) stays as it was made.
out = Console(highlight=False, soft_wrap=True)
#: Progress, logs and errors.
err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[str | None, typer.Option(
    "--db", envvar="SCALECTL_DB", help="SQLite store (default ./scalectl.db, or $SCALECTL_DB).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")]


def open_store(db: str | None, *, create: bool = False):
    """Open the store named by ``--db`` / ``$SCALECTL_DB`` / ``./scalectl.db``.

    Only the commands that add runs pass ``create=True``: the others never
    leave an empty store (or its folder) behind.
    """
    from scalectl.store import Store, default_db_path

    return Store.open(db or default_db_path(), create=create)


def print_json(data: Any) -> None:
    """Write ``data`` as JSON on stdout (non-JSON values via ``str``)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def user_errors(fn: Callable) -> Callable:
    """Decorator: turn :class:`UserError` into a message on stderr and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            # the message quotes user input: a '[/x]' in it is text, not rich markup
            err.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats rounded (zero as ``0``), None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}"
    return str(value)
