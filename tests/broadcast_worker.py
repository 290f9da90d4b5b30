"""One rank of the weight-broadcast check (run by tests/test_broadcast.py).

``python tests/broadcast_worker.py RANK WORLD PORT OUT``: rank 0 (the trainer)
holds the tiny model built with seed 0, every other rank (a generator) one
built with seed RANK; rank 0 broadcasts its weights in 64 KiB buckets over a
gloo group of all ranks, twice (the second after changing its weights), and
each rank saves its state dict and the broadcast's stats to OUT.RANK.pt.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch


def main(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from scalectl.rl.broadcast import broadcast_weights, weight_group
    from scalectl.rl.model import build_tiny_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    group = weight_group(list(range(world)))
    model = build_tiny_model(seed=0 if rank == 0 else rank)
    tensors = list(model.state_dict().values())
    first = broadcast_weights(tensors, src=0, group=group, bucket_bytes=64 * 1024)
    if rank == 0:                                  # an optimiser step, in effect
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5).add_(0.125)
    second = broadcast_weights(tensors, src=0, group=group, bucket_bytes=64 * 1024)
    torch.save({"state": model.state_dict(), "stats": [(s.bytes, s.buckets) for s in (first, second)]},
               f"{out}.{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
