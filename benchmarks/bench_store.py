"""Store write speed: 100,000 evaluation points in one call, and 8 concurrent writer processes.

1. ``Store.add_points`` of 100,000 points (every column filled, a 16-entry
   ``correct_counts`` list each) into one run of a fresh store file; median of
   ``--repeats`` (a new file each time), wall-clock and this process's CPU time.
   Target: under 2 s wall-clock, judged only while the 1-minute load average
   stays under ``--max-load`` (the CPU time is printed either way).
2. ``--writers`` processes (default 8) open the same store file and each adds
   ``--points`` points, one ``add_point`` call (one transaction) per point, as
   training jobs do; then every (run, step) is counted.  Target: no row lost;
   rows/s (all writers together, from the first start to the last finish) is
   shown for scale.

    python benchmarks/bench_store.py [--n 100000] [--writers 8] [--points 500]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from common import Figure, Load, default_max_load, machine_line, median, print_table, report

TARGET_INSERT_S = 2.0


def make_points(n: int, start: int = 0) -> list[dict]:
    """``n`` evaluation points with every column of the store filled (steps start..start+n-1)."""
    return [{"step": s, "gpu_hours": 0.01 * s, "flops": 1e12 * s, "tokens": 4096 * s, "samples": 128 * s,
             "pass_rate": 0.3 + 0.3 * s / (s + 1000), "samples_per_prompt": 8, "correct_counts": [s % 9] * 16,
             "truncation_rate": 0.01, "mean_length": 12.5, "train_reward": 0.1, "entropy": 0.5,
             "logprob_mismatch": 1e-3, "retired_prompts": 0, "wall_seconds": 0.5 * s}
            for s in range(start, start + n)]


def insert_once(folder: Path, i: int, points: list[dict]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``add_points`` of ``points`` into a new store file."""
    from scalectl.store.database import Store

    with Store.open(folder / f"insert-{i}.db") as store:
        run_id = store.create_run(f"bench-{i}")
        t, c = time.perf_counter(), time.process_time()
        store.add_points(run_id, points)
        elapsed, cpu = time.perf_counter() - t, time.process_time() - c
        assert len(store.points(run_id)) == len(points)
    return elapsed, cpu


def _writer(path: str, name: str, n: int, barrier) -> None:
    from scalectl.store.database import Store

    with Store.open(path) as store:
        run_id = store.create_run(name)
        barrier.wait()
        for p in make_points(n):
            store.add_point(run_id, p)


def concurrent(path: Path, writers: int, n: int) -> tuple[float, int]:
    """(seconds, rows found) for ``writers`` processes adding ``n`` points each to ``path``."""
    from scalectl.store.database import Store

    Store.open(path).close()   # create and migrate once
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers + 1)
    procs = [ctx.Process(target=_writer, args=(str(path), f"writer-{w}", n, barrier)) for w in range(writers)]
    for p in procs:
        p.start()
    barrier.wait()
    t = time.perf_counter()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - t
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a writer failed: exit codes {[p.exitcode for p in procs]}")
    with Store.open(path) as store:
        found = sum(len(store.points(r["id"])) for r in store.list_runs())
    return elapsed, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--points", type=int, default=500, help="points per writer")
    ap.add_argument("--max-load", type=float, default=default_max_load(),
                    help="1-minute load average above which no verdict is given (default nproc + 0.5)")
    args = ap.parse_args()
    print(machine_line())
    points = make_points(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        with Load() as load:
            measured = [insert_once(Path(tmp), i, points) for i in range(args.repeats)]
        times, cpus = [m[0] for m in measured], [m[1] for m in measured]
        with Load() as load_writers:
            elapsed, found = concurrent(Path(tmp) / "concurrent.db", args.writers, args.points)
    expected = args.writers * args.points
    print_table("store writes", ["case", "seconds", "rows", "rows/s"], [
        [f"add_points, {args.n:,} points (median of {args.repeats})", median(times), args.n, args.n / median(times)],
        [f"{args.writers} writer processes x {args.points} add_point", elapsed, found, found / elapsed]])
    lo = (load.before, load.after)
    report(Figure("bench_store", f"insert {args.n:,} eval points (add_points, median)", median(times), "s",
                  "<", TARGET_INSERT_S, load=lo, max_load=args.max_load))
    report(Figure("bench_store", f"insert {args.n:,} eval points, CPU time (median)", median(cpus), "s", load=lo))
    lw = (load_writers.before, load_writers.after)
    report(Figure("bench_store", f"{args.writers} concurrent writers: rows lost of {expected:,}",
                  expected - found, "rows", "==", 0, load=lw))
    report(Figure("bench_store", f"{args.writers} concurrent writers, one transaction per point",
                  found / elapsed, "rows/s", load=lw))


if __name__ == "__main__":
    main()
