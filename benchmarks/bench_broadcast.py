"""Weight broadcast: time and bytes/s of one update from the first trainer to 1, 2 and 4 generators.

One process sends (the first trainer), M processes receive (generators), over
gloo on this machine's loopback, with :func:`scalectl.rl.transport.broadcast.broadcast_weights`
in its default 256 MiB buckets.  The models are 10M and 100M fp32 parameters
as 1M-element tensors (4 MB each, a transformer layer's order of size).  Each
case is the median of ``--repeats`` broadcasts; the time of one broadcast is
from a barrier to the moment the LAST receiver holds the weights.

The cost of an update at paper scale follows from the bytes: an 8B model in
bf16 is 16 GB per update.  A pipelined broadcast (NCCL's ring or tree) moves
each byte once per link, so its time is about bytes / bus bandwidth whatever
the number of receivers; the script prints that for NCCL bus bandwidths of
25 and 50 GB/s (50 GB/s is a 400 Gb/s InfiniBand NIC per GPU at line rate;
NVLink within a node is several times higher), beside what this machine's
gloo rate would give.  No target: figures for scale.

    python benchmarks/bench_broadcast.py [--params 10e6 100e6] [--generators 1 2 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from datetime import timedelta

from common import Figure, Load, machine_line, median, print_table, report

PAPER_BYTES = 8e9 * 2          # 8B parameters in bf16
NCCL_GBPS = (25.0, 50.0)


def _rank(rank: int, world: int, port: int, n_params: int, repeats: int, out) -> None:
    import torch
    import torch.distributed as dist

    from scalectl.rl.transport.broadcast import broadcast_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    chunk = 1_000_000
    tensors = [torch.full((min(chunk, n_params - i),), float(rank)) for i in range(0, n_params, chunk)]
    times = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        stats = broadcast_weights(tensors, src=0)
        done = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)          # until the last receiver has it
        times.append(float(done))
    assert all(float(x[0]) == 0.0 for x in tensors)          # every receiver holds rank 0's values
    if rank == 0:
        out.put((times, stats.bytes, stats.buckets))
    dist.destroy_process_group()


def measure(n_params: int, generators: int, repeats: int) -> tuple[float, int, int]:
    """(median seconds, bytes, buckets) of a broadcast from 1 sender to ``generators`` receivers."""
    from scalectl.rl.transport.roles import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port, world = free_port(), generators + 1
    procs = [ctx.Process(target=_rank, args=(r, world, port, n_params, repeats, out)) for r in range(world)]
    for p in procs:
        p.start()
    times, n_bytes, buckets = out.get(timeout=1800)
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a broadcast process failed: exit codes {[p.exitcode for p in procs]}")
    return median(times), n_bytes, buckets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, nargs="+", default=[10e6, 100e6])
    ap.add_argument("--generators", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(machine_line())
    rows, rates = [], []
    for n in (int(p) for p in args.params):
        for m in args.generators:
            with Load() as load:
                seconds, n_bytes, buckets = measure(n, m, args.repeats)
            rate = n_bytes / seconds
            rates.append(rate)
            rows.append([f"{n / 1e6:g}M fp32 -> {m} generator(s)", n_bytes / 1e6, buckets, seconds, rate / 1e9])
            report(Figure("bench_broadcast", f"weight broadcast {n / 1e6:g}M params ({n_bytes / 1e6:g} MB) "
                          f"to {m} generator(s), gloo", seconds, "s", load=(load.before, load.after)))
            report(Figure("bench_broadcast", f"weight broadcast {n / 1e6:g}M params to {m} generator(s), "
                          "rate to each", rate / 1e9, "GB/s", load=(load.before, load.after)))
    print_table("weight broadcast over gloo (median of %d)" % args.repeats,
                ["case", "MB", "buckets", "seconds", "GB/s to each"], rows)
    best = max(rates)
    lines = [f"8B bf16 update ({PAPER_BYTES / 1e9:g} GB): {PAPER_BYTES / best:,.0f} s at this machine's best "
             f"gloo rate ({best / 1e9:.2f} GB/s)"]
    lines += [f"8B bf16 update: {PAPER_BYTES / (g * 1e9):.2f} s at an NCCL bus bandwidth of {g:g} GB/s "
              "(pipelined broadcast: about the same for 1 or 64 generators)" for g in NCCL_GBPS]
    for line in lines:
        print("extrapolation: " + line)
    for g in NCCL_GBPS:
        report(Figure("bench_broadcast", f"8B bf16 update at NCCL {g:g} GB/s (extrapolated)",
                      PAPER_BYTES / (g * 1e9), "s"))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
