"""One rank of the in-flight weight-update check (run by tests/test_broadcast.py).

``python tests/receiver_worker.py RANK WORLD PORT OUT``: rank 0 (the trainer)
holds the tiny model built with seed 0, every other rank (a generator) one
built with another seed. First a plain broadcast in 64 KiB buckets (every rank
saves the weights and the broadcast's stats); then rank 0 broadcasts three
more versions (each step changes the weights) while the generators, holding a
CPU rollout engine whose ``poll_weights`` is a
:class:`scalectl.rl.transport.broadcast.WeightReceiver`, generate until the third has
arrived. Every rank saves its final weights and, for the generators, the
versions that tagged their tokens, to OUT.RANK.pt.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch


def main(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from scalectl.rl.transport.broadcast import WeightReceiver, broadcast_weights, weight_group
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.sampling import SamplingParams

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    group = weight_group(list(range(world)))
    model = build_tiny_model(seed=0 if rank == 0 else 10 + rank)
    tensors = list(model.state_dict().values())
    stats = broadcast_weights(tensors, src=0, group=group, bucket_bytes=64 * 1024)
    saved = {"first": {k: v.clone() for k, v in model.state_dict().items()},
             "first_stats": (stats.bytes, stats.buckets)}
    if rank == 0:
        dist.barrier()                                     # the generators have sampled with version 0
        for _ in range(3):
            with torch.no_grad():                          # an optimiser step, in effect
                for p in model.parameters():
                    p.mul_(0.9).add_(0.01)
            broadcast_weights(tensors, src=0, group=group, bucket_bytes=256 * 1024)
    else:
        engine = CPURolloutEngine(model, build_tokenizer(), head_fp32=True)
        receiver = WeightReceiver(tensors, src=0, group=group, bucket_bytes=256 * 1024,
                                  on_update=lambda v: engine.update_weights(None, v))
        engine.poll_weights = receiver.poll
        # one batch before the trainer sends anything: tokens of version 0, however slow this process
        out_ = engine.generate(["1+2="], 2, SamplingParams(max_new_tokens=8), seed=0)
        versions = [c.versions for g in out_ for c in g]
        dist.barrier()
        while receiver.version < 3:
            out_ = engine.generate(["1+2="], 2, SamplingParams(max_new_tokens=8), seed=receiver.version)
            versions += [c.versions for g in out_ for c in g]
        saved.update(versions=versions, stats=(receiver.stats.bytes, receiver.stats.buckets))
    saved["state"] = model.state_dict()
    dist.barrier()
    torch.save(saved, f"{out}.{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
