"""Cold-start time of the command line: ``scalectl --help`` and ``scalectl runs`` on an empty store.

Each command runs as a fresh subprocess (the installed ``scalectl`` entry point
of this environment), ``--repeats`` times after one untimed warm-up (which
fills the OS file cache, as a second invocation by a user would); the median
wall-clock is the figure.  Target: under 0.3 s each.

    python benchmarks/bench_cli.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Figure, machine_line, median, print_table, report

TARGET_S = 0.3


def entry_point() -> list[str]:
    """The ``scalectl`` console script next to this Python, or ``python -m scalectl.cli``."""
    script = Path(sys.executable).with_name("scalectl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "scalectl.cli"]


def run_times(cmd: list[str], env: dict, repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` runs of ``cmd`` (after one warm-up); raises on failure."""
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    print(machine_line())
    exe = entry_point()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SCALECTL_DB": str(Path(tmp) / "empty.db")}
        cases = {"scalectl --help": exe + ["--help"], "scalectl runs (empty store)": exe + ["runs"]}
        times = {name: [] for name in cases}
        for _ in range(2):   # two alternating rounds, so drift in the load hits every command
            for name, cmd in cases.items():
                times[name] += run_times(cmd, env, max(1, args.repeats // 2))
    rows = [[name, median(t), min(t), max(t), str(len(t))] for name, t in times.items()]
    print_table("CLI cold start (s, fresh process each)", ["command", "median", "min", "max", "runs"], rows)
    for name, t in times.items():
        report(Figure("bench_cli", f"{name}, median cold start", median(t), "s", "<", TARGET_S))


if __name__ == "__main__":
    main()
