"""``scalectl compare`` over 50 imported runs of 100 points each.

A temporary store is filled with ``--runs`` synthetic curves (CSV files brought
in by ``scalectl import``'s code path, :func:`scalectl.store.importer.import_points`):
ScaleRL-like sigmoids (ceilings A from 0.55 to 0.70, B 1.2-2.2, C_mid
3,000-15,000 GPU-hours, R0 0.3) with noise sd 0.01.  Then ``scalectl compare
--json`` runs as a fresh process, as a user types it, with the default
1,000-sample bootstrap: first with no stored fit (every run is fitted), then
again (the stored fits are reused; they are recomputed only when points
change).  Target: the first compare under 5 s wall-clock, judged only while
the 1-minute load average stays under ``--max-load``; the CPU time of the
compare process (user + system) is printed either way.

    python benchmarks/bench_compare.py [--runs 50] [--points 100] [--repeats 3] [--max-load 2.5]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import Figure, Load, default_max_load, machine_line, median, print_table, report

TARGET_S = 5.0


def write_curves(folder: Path, runs: int, points: int, seed: int = 0) -> list[Path]:
    """``runs`` CSV files (compute, pass_rate) of noisy ScaleRL sigmoids; returns their paths."""
    from scalectl.curve import sigmoid

    rng = np.random.default_rng(seed)
    paths = []
    for i in range(runs):
        A, B, C_mid = rng.uniform(0.55, 0.70), rng.uniform(1.2, 2.2), rng.uniform(3000, 15000)
        x = np.linspace(500.0, 50_000.0, points)
        y = np.clip(sigmoid(x, A, B, C_mid, 0.3) + rng.normal(0, 0.01, points), 0, 1)
        path = folder / f"run{i:02d}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["compute", "pass_rate"])
            w.writerows(zip(x.tolist(), y.tolist()))
        paths.append(path)
    return paths


def fill_store(db: Path, paths: list[Path]) -> None:
    """Import every CSV as its own run."""
    from scalectl.store.importer import import_points
    from scalectl.store.database import Store

    with Store.open(db) as store:
        for p in paths:
            import_points(store, p, p.stem)


def compare_seconds(db: Path) -> tuple[float, float, dict]:
    """(wall-clock seconds, CPU seconds, parsed JSON) of one ``scalectl compare --json`` process on ``db``."""
    exe = Path(sys.executable).with_name("scalectl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "scalectl.cli"]
    before, t = os.times(), time.perf_counter()
    out = subprocess.run(cmd + ["compare", "--json", "--db", str(db)], check=True, capture_output=True, text=True,
                         env={**os.environ, "SCALECTL_DB": str(db)})
    wall, after = time.perf_counter() - t, os.times()
    cpu = after.children_user - before.children_user + after.children_system - before.children_system
    return wall, cpu, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-load", type=float, default=default_max_load(),
                    help="1-minute load average above which no verdict is given (default nproc + 0.5)")
    args = ap.parse_args()
    print(machine_line())
    cold, warm, cold_cpu, warm_cpu = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_curves(Path(tmp), args.runs, args.points)
        with Load() as load:
            for i in range(args.repeats):   # alternate: fresh store (every run fitted), then the same store again
                db = Path(tmp) / f"store-{i}.db"
                fill_store(db, paths)
                t, c, data = compare_seconds(db)
                cold.append(t)
                cold_cpu.append(c)
                t, c, _ = compare_seconds(db)
                warm.append(t)
                warm_cpu.append(c)
    n = len(data.get("fits", {}))
    if n != args.runs:
        raise SystemExit(f"compare fitted {n} runs, expected {args.runs}")
    print_table(f"scalectl compare, {args.runs} runs x {args.points} points, 1,000-sample bootstrap (s)",
                ["case", "median", "min", "max", "CPU median"],
                [["first compare (every run fitted)", median(cold), min(cold), max(cold), median(cold_cpu)],
                 ["again (stored fits)", median(warm), min(warm), max(warm), median(warm_cpu)]])
    lo = (load.before, load.after)
    for case, wall, cpu in (("fits computed", cold, cold_cpu), ("stored fits", warm, warm_cpu)):
        name = f"scalectl compare, {args.runs} runs x {args.points} points, {case}"
        report(Figure("bench_compare", name, median(wall), "s", "<", TARGET_S, load=lo, max_load=args.max_load))
        report(Figure("bench_compare", f"{name}, CPU time", median(cpu), "s", load=lo))


if __name__ == "__main__":
    main()
