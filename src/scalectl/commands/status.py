"""``scalectl status``: runs as jobs of their launcher (local or Slurm), once or live."""

from __future__ import annotations

from typing import Annotated

import typer

from scalectl.commands.bounds import MAX_POLL_S, number
from scalectl.commands.common import (
    DbOption,
    FormatOption,
    JsonOption,
    err,
    open_store,
    out,
    print_json,
    user_errors,
)
from scalectl.display import Column, TableData, format_number
from scalectl.errors import UserError


def _first_line(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 3] + "..."


def _status_rows(db, run: list[str] | None, ids: set[int] | None = None) -> list[dict]:
    """The runs (all, those named, or those with ``ids``), each refreshed with its launcher when
    alive (:func:`scalectl.launch.registry.current_runs`, as `scalectl runs` shows them)."""
    from scalectl.launch.registry import current_runs

    with open_store(db) as store:
        wanted = {store.get_run(r)["id"] for r in run} if run else ids
        return current_runs(store, wanted)


#: The columns of the status table: name, status and pass rate stay at any width.
STATUS_COLUMNS = (Column("id", priority=2), Column("name", "left", keep=True), Column("status", "left", keep=True),
                  Column("job", "left", priority=1), Column("job state", "left", priority=3),
                  Column("eval step", priority=4), Column("pass rate", keep=True), Column("trunc.", priority=0))


def _status_table(rows: list[dict], db, title: str | None = None) -> TableData:
    """The runs' table (:data:`STATUS_COLUMNS`), each cell whole."""
    cells = []
    for r in rows:
        job = f"{r.get('launcher') or '-'} {r.get('job_id')}" if r.get("job_id") else (r.get("launcher") or "-")
        cells.append([str(r["id"]), r["name"], r["status"], job, r.get("launcher_state") or "-",
                      *(format_number(r.get(k), decimals=True)
                        for k in ("last_step", "last_pass_rate", "last_truncation_rate"))])
    return TableData(title or f"runs in {db or 'the store'}", STATUS_COLUMNS, cells)


def _status_line(r: dict) -> str:
    step, rate, trunc = (format_number(r.get(k), decimals=True)
                         for k in ("last_step", "last_pass_rate", "last_truncation_rate"))
    return f"{r['name']}: {r['status']}, evaluated at step {step}, pass rate {rate}, truncation {trunc}"


def _watch(db, run: list[str] | None, interval: float) -> None:
    """Refresh the runs' table every ``interval`` seconds (:mod:`scalectl.present.watch`: a live
    table on a terminal, elsewhere a plain line per run whose status or step changed) until none
    of them is active."""
    from scalectl.launch.base import ACTIVE
    from scalectl.present.watch import LiveRows, follow

    rows = _status_rows(db, run)
    ids = {r["id"] for r in rows} if run else {r["id"] for r in rows if r["status"] in ACTIVE}
    if not ids:
        out.print("no active runs to watch")
        return

    def table(rows: list[dict]):
        active = [r for r in rows if r["status"] in ACTIVE]
        return _status_table(rows, db, f"{len(active)} of {len(rows)} run(s) active in {db or 'the store'}, "
                                       f"every {interval:g} s (Ctrl-C stops watching, not the runs)").render(out.width)

    try:
        with LiveRows(out, table, _status_line, lambda r: (r["id"], (r["status"], r.get("last_step")))) as view:
            follow(lambda: _status_rows(db, None, ids), view.show, interval)
    except KeyboardInterrupt:
        pass


@user_errors
def status(
    run: Annotated[list[str] | None, typer.Argument(metavar="[RUN]...", help="Runs (names or ids); default all.")] = None,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Keep refreshing the active runs (or RUN...) until they end.")] = False,
    interval: Annotated[float, typer.Option(callback=number(0.1, MAX_POLL_S),
                                            help="Seconds between refreshes with --watch.")] = 2.0,
    db: DbOption = None,
    json_: JsonOption = False,
    fmt: FormatOption = "table",
) -> None:
    """Every run with its job: launcher state, last step, pass rate, truncation rate.

    The status of a run whose job is alive is checked with its launcher
    (process table, Slurm) and corrected in the store: a job cancelled with
    scancel shows as cancelled, one that died without a result as failed
    (with the tail of its log).  With --watch, a live table of the active runs
    (on a terminal) or a plain line per change (elsewhere) until they end.  At a narrow terminal
    the least useful columns are dropped (named under the table); in a pipe or a file every
    column is printed whole (--format csv: as CSV).
    """
    from scalectl.present.console import print_table

    json_ = json_ or fmt == "json"
    if watch:
        if json_ or fmt == "csv":
            raise UserError("--watch shows a live table; it does not combine with --json or --format csv|json")
        _watch(db, run, interval)
        return
    rows = _status_rows(db, run)
    if json_:
        print_json([{k: v for k, v in r.items() if k != "recipe"} for r in rows])
        return
    print_table(_status_table(rows, db), fmt)
    say = out if fmt == "table" else err        # under a CSV table, on stderr: stdout holds the CSV
    for r in rows:
        if r.get("error"):
            say.print(f"{r['name']}: {_first_line(r['error'].split('; log tail')[0], 200)}", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``status`` to the app."""
    app.command()(status)
