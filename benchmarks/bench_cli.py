"""Cold-start time of the command line: ``scalectl --help`` and ``scalectl runs`` on an empty store.

Each command runs as a fresh subprocess (the installed ``scalectl`` entry point
of this environment), ``--repeats`` times after one untimed warm-up (which
fills the OS file cache, as a second invocation by a user would), in two
alternating rounds.  ``scalectl runs`` reads a store that exists and holds no
run (made by the library before the timing; reading commands refuse a missing
store).  Figures: the median wall-clock (target: under 0.3 s
each, judged only while the load average stays under ``--max-load``), and the
median CPU time of the child (user + system), which a busy machine inflates
far less than wall-clock and so shows what the command itself costs.

    python benchmarks/bench_cli.py [--repeats 16] [--max-load 2.5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Figure, Load, default_max_load, machine_line, median, print_table, report

TARGET_S = 0.3


def entry_point() -> list[str]:
    """The ``scalectl`` console script next to this Python, or ``python -m scalectl.cli``."""
    script = Path(sys.executable).with_name("scalectl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "scalectl.cli"]


def run_times(cmd: list[str], env: dict, repeats: int) -> tuple[list[float], list[float]]:
    """(wall seconds, child CPU seconds) of ``repeats`` runs of ``cmd`` after one warm-up; raises on failure."""
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    wall, cpu = [], []
    for _ in range(repeats):
        before, t = os.times(), time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        wall.append(time.perf_counter() - t)
        after = os.times()
        cpu.append(after.children_user - before.children_user + after.children_system - before.children_system)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=16)
    ap.add_argument("--max-load", type=float, default=default_max_load(),
                    help="1-minute load average above which no verdict is given (default nproc + 0.5)")
    args = ap.parse_args()
    print(machine_line())
    exe = entry_point()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SCALECTL_DB": str(Path(tmp) / "empty.db")}
        from scalectl.store.database import Store

        Store.open(env["SCALECTL_DB"]).close()   # a store without runs (reading commands never create one)
        cases = {"scalectl --help": exe + ["--help"], "scalectl runs (empty store)": exe + ["runs"]}
        wall = {name: [] for name in cases}
        cpu = {name: [] for name in cases}
        with Load() as load:
            for _ in range(2):   # two alternating rounds, so drift in the load hits every command
                for name, cmd in cases.items():
                    w, c = run_times(cmd, env, max(1, args.repeats // 2))
                    wall[name] += w
                    cpu[name] += c
    rows = [[name, median(wall[name]), min(wall[name]), max(wall[name]), median(cpu[name]), str(len(wall[name]))]
            for name in cases]
    print_table(f"CLI cold start (s, fresh process each; {load})",
                ["command", "wall median", "wall min", "wall max", "CPU median", "runs"], rows)
    for name in cases:
        report(Figure("bench_cli", f"{name}, median cold start", median(wall[name]), "s", "<", TARGET_S,
                      load=(load.before, load.after), max_load=args.max_load))
        report(Figure("bench_cli", f"{name}, median CPU time (user+sys)", median(cpu[name]), "s",
                      load=(load.before, load.after)))


if __name__ == "__main__":
    main()
