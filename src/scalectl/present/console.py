"""The two consoles of scalectl's output: human output on stdout, progress, logs and errors on stderr.

Commands print human output with rich on stdout (``--json``: only JSON there); progress
and logs go to stderr, so that the JSON on stdout stays parseable.
"""

from __future__ import annotations

from rich.console import Console

#: Human output.  Lines are not wrapped: a terminal folds them itself, and text written to a
#: file or a pipe (a command to copy, the TOML ``validate`` prints) stays as it was made.
out = Console(highlight=False, soft_wrap=True)
#: Progress, logs and errors.
err = Console(stderr=True, highlight=False, soft_wrap=True)

#: The ways ``--format`` prints a table: fitted to the terminal (whole off one), CSV, or the
#: command's JSON (as ``--json``).
FORMATS = ("table", "csv", "json")


def table_width() -> int | None:
    """The width tables are fitted to: the terminal's, or None off a terminal (a pipe, a
    file), where every column is printed whole."""
    return out.width if out.is_terminal else None


def print_table(data, fmt: str = "table") -> None:
    """Print a :class:`~scalectl.display.TableData` on stdout.

    ``fmt`` ``csv``: the header and rows as CSV.  Otherwise a rich table: at a terminal
    the columns that fit its width (the dropped ones named under it); off a terminal every
    column, each cell whole, however wide the lines get (a log keeps every number).

    Raises:
        ValueError: ``fmt`` not one of :data:`FORMATS` (``json`` is the command's own).
    """
    if fmt == "csv":
        out.file.write(data.csv())
        out.file.flush()
        return
    if fmt != "table":
        raise ValueError(f"table format {fmt!r} is not one of: table, csv")
    width = table_width()
    if width is not None:
        out.print(data.render(width))
        return
    # Off a terminal the console is as wide as $COLUMNS (80 by default): a console as wide as
    # the table draws it whole.
    whole = Console(file=out.file, width=max(data.width, out.width), highlight=False, soft_wrap=True,
                    color_system=None)
    whole.print(data.render(None))
