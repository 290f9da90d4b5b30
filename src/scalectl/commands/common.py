"""Plumbing shared by the CLI commands: the store option and :func:`open_store`, JSON output,
errors, the options of the fitting commands, and the end of an ablation.

Commands print human output with rich on stdout, or with ``--json`` only JSON
on stdout; progress and logs go to stderr.  A :class:`~scalectl.errors.UserError`
becomes its message on stderr and exit status 2.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Sequence

import typer
from rich.markup import escape

from scalectl.commands.bounds import MAX_SEED, margin_choice, number, r0_choice
from scalectl.defaults import MAX_BOOTSTRAP
from scalectl.errors import UserError
from scalectl.present.console import err, out  # noqa: F401  (the commands' consoles)

DbOption = Annotated[str | None, typer.Option(
    "--db", envvar="SCALECTL_DB", help="SQLite store (default ./scalectl.db, or $SCALECTL_DB).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")]


def format_choice(value: str) -> str:
    """A typer callback for ``--format``: one of :data:`scalectl.present.console.FORMATS`.

    Raises (when called):
        typer.BadParameter: naming the value and the formats allowed (click: exit status 2).
    """
    from scalectl.present.console import FORMATS

    if value not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of: {', '.join(FORMATS)}")
    return value


FormatOption = Annotated[str, typer.Option(
    "--format", callback=format_choice, metavar="table|csv|json",
    help="table: fitted to the terminal, every column whole in a pipe or a file; csv: the table's cells "
         "(stdout holds only the CSV, the lines under the table go to stderr); json: as --json.")]


def open_store(db: str | None, *, create: bool = False):
    """Open the store named by ``--db`` / ``$SCALECTL_DB`` / ``./scalectl.db``
    (:meth:`scalectl.store.database.Store.open`): how every command opens it, and what it hands
    the library as ``stores`` (``functools.partial(open_store, db)``, :mod:`scalectl.launch.runs`).

    Only the commands that add runs pass ``create=True``: the others never
    leave an empty store (or its folder) behind.  Run journals written since the
    last command (jobs on other hosts) are taken in first (:mod:`scalectl.store.journal`).
    """
    from scalectl.store.database import default_db_path
    from scalectl.store.journal import open_with_journals

    return open_with_journals(db or default_db_path(), create=create)


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


AxisOption = Annotated[str | None, typer.Option(
    "--axis", help="Compute axis: gpu_hours, flops, tokens or step (default: the run's recipe "
                   "fit.axis, else gpu_hours).")]


MinComputeOption = Annotated[float | None, typer.Option(
    "--min-compute", callback=number(0.0), help="Fit window start, in axis units, >= 0 (default: the recipe's "
    "fit.min_compute on its own axis, else 1500 GPU-hours at paper scale or 1.5% of the run).")]


MethodOption = Annotated[str, typer.Option(
    "--method", help="vp (bounded least squares from a variable-projection start) or grid "
                     "(the paper's A.5 grid).")]


R0Option = Annotated[str | None, typer.Option(
    "--r0", callback=r0_choice, help="auto (measured at compute 0 if there, else fitted), measured, fit, or a number "
    "(default: the recipe's fit.r0, else auto).")]


BootstrapOption = Annotated[int, typer.Option(
    "--bootstrap", callback=number(0, MAX_BOOTSTRAP, note="what a resample keeps in memory"),
    help=f"Bootstrap resamples, 0..{MAX_BOOTSTRAP:,} (0: none).")]


SeedOption = Annotated[int, typer.Option("--seed", callback=number(0, MAX_SEED), help="Bootstrap seed.")]


MarginOption = Annotated[float, typer.Option(
    "--margin", callback=number(0.0, 1.0, lo_open=True, hi_open=True, note="a difference of pass rates"),
    help="Noise margin on A, > 0 and < 1 (paper: 0.02).")]


MarginChoiceOption = Annotated[str | None, typer.Option(
    "--margin", callback=margin_choice, metavar="auto|NUMBER",
    help="Noise margin on A: a number > 0 and < 1, or auto: measured from the baseline recipe's seeds in the "
         "store (scalectl margin); default: the paper's 0.02.")]


LevelOption = Annotated[float, typer.Option(
    "--level", callback=number(0.0, 1.0, lo_open=True, hi_open=True), help="Interval level, > 0 and < 1.")]


PlotOption = Annotated[Path | None, typer.Option("--plot", help="Write a figure (.png or .svg).")]


SeriesOption = Annotated[str | None, typer.Option(
    "--series", help="Fit the runs' evaluation series of this name (scalectl evaluate) instead of their "
                     "validation points.")]


def note(message: str) -> None:
    """A note of the library (a run fitted on another axis, ...) on stderr, as written."""
    err.print(message, markup=False, soft_wrap=True)


def print_flags(name: str, fit, said: Sequence[str] = (), console=None) -> None:
    """One line per flag of ``fit`` (a :class:`~scalectl.curve.SigmoidFit`), led by the run's name,
    on ``console`` (default: stdout's); a flag whose message one of the lines ``said`` already
    holds is not printed again."""
    for f in fit.flags:
        if not any(f.message in line for line in said):
            (console or out).print(f"[yellow]{name}[/yellow] {f.code}: {f.message}", soft_wrap=True)


def write_figure(fn, data, path: Path, **kwargs) -> Path:
    """``fn(data, path, **kwargs)`` (a figure of :mod:`scalectl.present.plot`), its ValueError a
    :class:`UserError`; returns the path written."""
    try:
        return fn(data, path, **kwargs)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def print_ablation(result, paths: dict, data: dict | None = None) -> None:
    """The end of ``ablate`` and ``report``: the verdicts of every variant of an ablation against
    its base (an :class:`~scalectl.ablation.analysis.AblationResult`), a sentence each, its notes,
    and where its report went (``paths``); or ``data`` as JSON, when given."""
    from scalectl.present.ablation import verdict_table

    if data is not None:
        print_json(data)
        return
    out.print(verdict_table(result))
    if result.margin_source:
        out.print(f"margin {result.margin:.3g} ({result.margin_source['where']})", soft_wrap=True, markup=False,
                  highlight=False)
    for v in result.variants:
        out.print(v.sentence, soft_wrap=True)
    for note in result.notes:
        out.print(f"note: {note}", soft_wrap=True)
    err.print(f"wrote {paths['html']} and {paths['markdown']}")
