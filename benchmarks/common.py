"""Shared helpers of the benchmark scripts: timing, peak memory, the machine, and
one consistent way of printing a figure against its target.

Every benchmark prints, for each figure that has a target, one line::

    target: <figure> <op> <target> <unit>: <value> <unit>, met      (or MISSED)

with the 1-minute load average before and after the measurement when the
script recorded it.  A figure measured while the load average went above the
script's stated bound (``--max-load``; default :func:`default_max_load`) gets
no verdict: it prints ``load too high, rerun`` instead of met / MISSED, since a
shared machine's other work is then part of the figure.

and, when ``$BENCH_RESULTS`` names a file, appends the figure to it as one JSON
line (``make bench`` collects them; ``python benchmarks/common.py summary FILE``
prints the Markdown table of ``benchmarks/README.md``).

    python benchmarks/common.py machine            # nproc, CPU model, load average
    python benchmarks/common.py summary FILE.jsonl  # the README table
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = {"<": lambda v, t: v < t, "<=": lambda v, t: v <= t, ">": lambda v, t: v > t, ">=": lambda v, t: v >= t,
       "==": lambda v, t: v == t}


def loadavg1() -> float:
    """The 1-minute load average (``os.getloadavg``)."""
    return round(os.getloadavg()[0], 2)


def default_max_load() -> float:
    """The default load bound: ``nproc + 0.5``.  A benchmark itself keeps up to
    ``nproc`` threads busy; half a core more means the figure is mostly its own."""
    return (os.cpu_count() or 1) + 0.5


class CpuSteal:
    """The share of this machine's CPU time that the hypervisor gave to other machines (steal,
    ``/proc/stat``) between construction and :meth:`share`: a shared virtual machine can lose
    a third of its time this way with its load average unchanged.  0 where /proc/stat is absent."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return 0, 0
        return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])

    def share(self) -> float:
        """Steal over all CPU time since construction, in [0, 1]."""
        steal, total = self._read()
        d_total = total - self.start[1]
        return (steal - self.start[0]) / d_total if d_total > 0 else 0.0


class Load:
    """Context manager recording the 1-minute load average before and after a block.

    Attributes:
        before, after: load averages (``after`` set on exit).
    """

    def __init__(self):
        self.before = loadavg1()
        self.after: float | None = None

    def __enter__(self) -> "Load":
        self.before = loadavg1()
        return self

    def __exit__(self, *exc) -> None:
        self.after = loadavg1()

    @property
    def peak(self) -> float:
        """The higher of before and after."""
        return max(self.before, self.after if self.after is not None else self.before)

    def __str__(self) -> str:
        return f"load {self.before:.2f}->{self.after if self.after is not None else float('nan'):.2f}"


def timed(fn, repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn()`` (perf_counter)."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median(xs) -> float:
    """The median of a non-empty sequence."""
    return statistics.median(list(xs))


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (``getrusage``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """nproc, CPU model, 1/5/15-minute load averages, Python and torch-free platform facts."""
    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "loadavg": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "platform": platform.platform()}


def machine_line() -> str:
    """One printable line of :func:`machine`."""
    m = machine()
    return (f"machine: {m['nproc']} CPUs ({m['cpu']}), load average {m['loadavg'][0]:.2f} "
            f"{m['loadavg'][1]:.2f} {m['loadavg'][2]:.2f}, Python {m['python']}")


@dataclass
class Figure:
    """One measured figure and, if it has one, its target.

    Attributes:
        bench: the script (``bench_store``).
        name: what was measured, in words.
        value: the measurement, in ``unit``.
        unit: ``s``, ``rows/s``, ``x`` (a ratio), ...
        op, target: the target is ``value op target`` (``op`` one of <, <=, >, >=, ==);
            None for a figure shown for scale only.
        load: 1-minute load average (before, after) the measurement, or None.
        max_load: the bound the load had to stay under for a verdict, or None.
    """

    bench: str
    name: str
    value: float
    unit: str = ""
    op: str | None = None
    target: float | None = None
    load: tuple[float, float] | None = None
    max_load: float | None = None

    @property
    def load_ok(self) -> bool:
        """Whether the load stayed under ``max_load`` (True without a bound or a record)."""
        return self.max_load is None or self.load is None or max(self.load) <= self.max_load

    @property
    def met(self) -> bool | None:
        """Whether the target is met; None without a target or when the load was too high."""
        if self.op is None or self.target is None or not self.load_ok:
            return None
        return bool(OPS[self.op](self.value, self.target))

    def verdict(self) -> str:
        """``met``, ``MISSED``, ``load too high, rerun`` or ``-``."""
        if not self.load_ok:
            return "load too high, rerun"
        return {True: "met", False: "MISSED", None: "-"}[self.met]


def _fmt(x: float) -> str:
    if x == 0 or 0.01 <= abs(x) < 1e6:
        return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"
    return f"{x:.3g}"


def report(fig: Figure) -> Figure:
    """Print ``fig``'s target line (or its value line) and append it to ``$BENCH_RESULTS``."""
    unit = f" {fig.unit}" if fig.unit else ""
    load = ""
    if fig.load is not None:
        bound = f" (bound {fig.max_load:.2f})" if fig.max_load is not None else ""
        load = f" [load {fig.load[0]:.2f}->{fig.load[1]:.2f}{bound}]"
    if fig.op is None:
        rerun = "" if fig.load_ok else ", load too high, rerun"
        print(f"figure: {fig.name}: {_fmt(fig.value)}{unit}{rerun}{load}")
    else:
        print(f"target: {fig.name} {fig.op} {_fmt(fig.target)}{unit}: {_fmt(fig.value)}{unit}, "
              f"{fig.verdict()}{load}")
    path = os.environ.get("BENCH_RESULTS")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({**asdict(fig), "met": fig.met, "verdict": fig.verdict(),
                                 "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "loadavg": os.getloadavg()[0]}) + "\n")
    return fig


def print_table(title: str, columns: list[str], rows: list[list], left: int = 1) -> None:
    """A rich table: the first ``left`` columns left-aligned, the others right-aligned."""
    from rich.console import Console
    from rich.table import Table

    from rich import box

    # compact (no vertical rules) and folded, never cut: a cell too wide for the terminal
    # wraps onto a second line instead of losing its last characters
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i < left else "right", overflow="fold")
    for row in rows:
        table.add_row(*[r if isinstance(r, str) else _fmt(r) for r in row])
    Console().print(table)


def summary(path: str) -> str:
    """The Markdown table (figure, value, target, met?) of a ``$BENCH_RESULTS`` file."""
    lines = ["| benchmark | figure | value | target | met? | load before->after |", "|---|---|---|---|---|---|"]
    for line in Path(path).read_text().splitlines():
        f = json.loads(line)
        unit = f" {f['unit']}" if f["unit"] else ""
        target = f"{f['op']} {_fmt(f['target'])}{unit}" if f["op"] else "-"
        met = {True: "yes", False: "**no**", None: "-"}[f["met"]]
        if f.get("verdict") == "load too high, rerun":
            met = "load too high, rerun"
        load = f"{f['load'][0]:.2f}->{f['load'][1]:.2f}" if f.get("load") else "-"
        lines.append(f"| {f['bench']} | {f['name']} | {_fmt(f['value'])}{unit} | {target} | {met} | {load} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "machine":
        print(machine_line())
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        print(summary(sys.argv[2]))
    else:
        sys.exit("usage: python benchmarks/common.py machine | summary FILE.jsonl")
