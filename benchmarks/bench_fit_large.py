"""``scalectl fit`` of one imported run of 300,000 points: peak memory and time.

A CSV of ``--points`` evaluation points (ScaleRL 8B batch 2048 of the paper's Table 1: A
0.645, B 1.70, C_mid 10,909 GPU-hours, R0 0.3, compute 0..50,000 GPU-hours, noise sd
0.01) is brought in by ``scalectl import``; then ``scalectl fit RUN --json`` runs as a
fresh process with the default 1,000-sample bootstrap, as a user types it.  Printed: the
peak resident set size of that process (``getrusage`` of the children) against 1 GB, its
wall-clock time against 30 s (judged only while the load average stays under
``--max-load``), its CPU time, and the fitted ceiling with its interval (the truth is
0.645).  The fit bins the window into at most 2,000 runs of consecutive points
(:func:`scalectl.curve.solvers.bin_points`) and evaluates its grids in blocks
(:data:`scalectl.curve.solvers.GRID_BLOCK_ELEMENTS`).

    python benchmarks/bench_fit_large.py [--points 300000] [--max-load 2.5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import Figure, Load, default_max_load, machine_line, report

TARGET_MIB = 1024.0
TARGET_S = 30.0


def write_csv(path: Path, n: int, seed: int = 0) -> None:
    """``n`` points of the paper's batch-2048 curve with noise sd 0.01, one per step."""
    from scalectl.curve import sigmoid

    x = np.linspace(0.0, 50_000.0, n)
    y = np.clip(sigmoid(x, 0.645, 1.70, 10909.0, 0.3) + np.random.default_rng(seed).normal(0, 0.01, n), 0, 1)
    with path.open("w") as fh:
        fh.write("step,gpu_hours,pass_rate\n")
        fh.writelines(f"{i},{a:.6f},{b:.6f}\n" for i, (a, b) in enumerate(zip(x.tolist(), y.tolist())))


#: Runs the command given as its child and prints that child's peak RSS (KiB) last on stderr:
#: the peak of one command alone, whatever this process ran before.
_PEAK = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")


def scalectl(*args: str, db: Path) -> tuple[str, str, float, float, float]:
    """(stdout, stderr, wall-clock s, CPU s, peak RSS MiB) of one ``scalectl`` command on ``db``."""
    exe = Path(sys.executable).with_name("scalectl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "scalectl.cli"]
    before, t = os.times(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _PEAK, *cmd, *args, "--db", str(db)], check=True,
                          capture_output=True, text=True)
    wall, after = time.perf_counter() - t, os.times()
    cpu = after.children_user - before.children_user + after.children_system - before.children_system
    *err, peak = proc.stderr.strip().splitlines()
    return proc.stdout, "\n".join(err), wall, cpu, int(peak) / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=300_000)
    ap.add_argument("--max-load", type=float, default=default_max_load(),
                    help="1-minute load average above which no verdict is given (default nproc + 0.5)")
    args = ap.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        csv, db = Path(tmp) / "long.csv", Path(tmp) / "store.db"
        write_csv(csv, args.points)
        scalectl("import", str(csv), "--name", "long", db=db)
        with Load() as load:
            stdout, stderr, wall, cpu, rss = scalectl("fit", "long", "--json", db=db)
    fit = json.loads(stdout)["fits"][0]["fit"]
    lo, hi = fit["intervals"]["A"]
    print(f"fit of {args.points:,} points: A {fit['A']:.4f} [{lo:.4f}, {hi:.4f}] (truth 0.645), "
          f"B {fit['B']:.3f}, on {fit['n_points']:,} points; {stderr}")
    name = f"scalectl fit of a {args.points:,}-point import, 1,000-sample bootstrap"
    report(Figure("bench_fit_large", f"{name}, peak RSS", rss, "MiB", "<", TARGET_MIB))
    report(Figure("bench_fit_large", f"{name}, wall-clock", wall, "s", "<", TARGET_S,
                  load=(load.before, load.after), max_load=args.max_load))
    report(Figure("bench_fit_large", f"{name}, CPU time", cpu, "s", load=(load.before, load.after)))


if __name__ == "__main__":
    main()
