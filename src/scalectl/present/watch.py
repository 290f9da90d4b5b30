"""Live views of runs while they train: ``scalectl status --watch`` and the runs of ``scalectl ablate``.

On a terminal a rich ``Live`` table, redrawn at each look; elsewhere (a pipe, a log
file) one plain line per run whose state changed, never a table cut to a width.
:func:`follow` looks at the runs until none of them is alive.
"""

from __future__ import annotations

import time
from typing import Callable, Hashable

from rich.console import Console
from rich.table import Table


class LiveRows:
    """Show rows of runs again and again: a live table on a terminal, else a line per change.

    Args:
        console: where to show them (rich).
        table: the table of all the rows (on a terminal).
        line: the plain line of one row (elsewhere), printed as text (no markup).
        key: a row's identity (a run id or name) and its state (status, step): a line is
            printed when the state of an identity differs from the last one printed.

    Use it as a context manager (the live table starts at the first :meth:`show` and stops
    at the end, or at :meth:`stop`).
    """

    def __init__(self, console: Console, table: Callable[[list[dict]], Table], line: Callable[[dict], str],
                 key: Callable[[dict], tuple[Hashable, tuple]]):
        self.console, self.table, self.line, self.key = console, table, line, key
        self.seen: dict[Hashable, tuple] = {}
        self.live = None
        self.stopped = False

    def __enter__(self) -> "LiveRows":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the live table (it stays on the screen as last drawn); later rows are not shown."""
        self.stopped = True
        if self.live:
            self.live.stop()
            self.live = None

    def show(self, rows: list[dict]) -> None:
        """Redraw the table (a terminal), or print a line per row whose state changed."""
        if self.stopped:
            return
        if self.console.is_terminal:
            if self.live is None:
                from rich.live import Live

                self.live = Live(console=self.console, auto_refresh=False, transient=False)
                self.live.start()
            self.live.update(self.table(rows), refresh=True)
            return
        for r in rows:
            ident, state = self.key(r)
            if self.seen.get(ident) != state:
                self.seen[ident] = state
                self.console.print(self.line(r), markup=False, highlight=False, soft_wrap=True)


def follow(fetch: Callable[[], list[dict]], show: Callable[[list[dict]], None] | None, interval: float,
           sleep: Callable[[float], None] = time.sleep) -> list[dict]:
    """Look at the runs every ``interval`` seconds until none is alive; return the last look.

    Args:
        fetch: the rows of the runs, each with its ``status`` (as the store holds it,
            refreshed with the launcher).
        show: called with the rows of every look (:meth:`LiveRows.show`), or None.

    A run is alive while its status is one of :data:`scalectl.launch.base.ACTIVE`.
    """
    from scalectl.launch.base import ACTIVE

    while True:
        rows = fetch()
        if show is not None:
            show(rows)
        if not any(r["status"] in ACTIVE for r in rows):
            return rows
        sleep(interval)
