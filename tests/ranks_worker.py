"""One trainer rank of the leader/follower check (run by tests/test_data_parallel.py).

``python tests/ranks_worker.py RANK WORLD PORT OUT CKPT``: rank 0 leads three
steps on fixed batches through :class:`scalectl.rl.data_parallel.TrainerRanks`
(a checkpoint saved after the second, loaded after the third), the other rank
follows (:func:`scalectl.rl.data_parallel.follow`); each rank saves its
parameters and what it saw to OUT.RANK.pt.
"""

from __future__ import annotations

import os
import sys

import torch

from dp_worker import make_groups


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def main(rank: int, world: int, port: int, out: str, ckpt: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    from scalectl.recipe import Loss, Optim
    from scalectl.rl.data_parallel import TrainerRanks, follow
    from scalectl.rl.model import build_tiny_model
    from scalectl.rl.trainer import PolicyTrainer

    # lr = eps = 1: each update is close to the gradient itself (see dp_worker.py), so a wrong
    # gradient shows; grad_clip 0.05 is below the gradients' norm here, so the global norm matters
    trainer = PolicyTrainer(build_tiny_model(seed=0), loss=Loss(type="cispo", aggregation="prompt"),
                            optim=Optim(lr=1.0, warmup_steps=0, eps=1.0, weight_decay=0.0, grad_clip=0.05),
                            head_fp32=True, temperature=1.0, micro_batch_size=5)
    if rank == 0:
        ranks = TrainerRanks(trainer, "batch", pad_id=0)
        metrics = [ranks.step(make_groups(seed=s)) for s in (0, 1)]
        ranks.save(ckpt)
        after_two = flat(trainer.model)
        metrics.append(ranks.step(make_groups(seed=2)))
        after_three = flat(trainer.model)
        ranks.load(ckpt)
        ranks.stop()
        saved = {"metrics": metrics, "after_two": after_two, "after_three": after_three,
                 "loaded": flat(trainer.model), "size": ranks.size}
    else:
        saved = {"steps": follow(trainer, "batch", pad_id=0), "loaded": flat(trainer.model)}
    torch.save(saved, f"{out}.{rank}.pt")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
